"""The Nature CNN (Mnih et al. 2015): the torso for image observations.

Three convolutions (32 8×8 filters at stride 4, 64 4×4 at stride 2, 64 3×3
at stride 1, each with a ReLU) and a fully connected layer of 512 ReLU units.
Observations are channel-first frame stacks [C, H, W]; for Atari [4, 84, 84].

Frames arrive as uint8 all the way from the env to the device (a quarter of
float32's bytes in every buffer and every copy) and are scaled to [0, 1]
here, on the device, as the first operation of the forward pass. Like every
torso (fedrl.client.training.networks) it takes the observation batch
flattened to [B, C·H·W] and unflattens it itself.
"""

from __future__ import annotations

import torch
from torch import nn

CONV_LAYERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
"""(out channels, kernel, stride) of each convolution."""
FEATURES = 512
"""Width of the fully connected layer: the features the heads read."""
PIXEL_SCALE = 1.0 / 255.0


def conv_output_size(size: int) -> int:
    """Height (or width) of the last convolution's output for an input of `size` pixels."""
    for _, kernel, stride in CONV_LAYERS:
        size = (size - kernel) // stride + 1
    return size


def smallest_input(size: int) -> int:
    """The smallest input height (width) whose last convolution output is `size`: the inverse
    of conv_output_size, used to tell a saved network's input from its tensor shapes."""
    for _, kernel, stride in reversed(CONV_LAYERS):
        size = (size - 1) * stride + kernel
    return size


def is_image(obs_shape: tuple[int, ...]) -> bool:
    """Whether observations of this shape are channel-first images the CNN can read."""
    return len(obs_shape) == 3 and min(obs_shape[1:]) >= smallest_input(1)


class NatureCNN(nn.Module):
    """[B, C·H·W] pixels (uint8 or float, 0..255) to [B, 512] features."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        if not is_image(obs_shape):
            raise ValueError(
                f"the CNN reads channel-first images of at least {smallest_input(1)}×"
                f"{smallest_input(1)} pixels, got observations of shape {obs_shape}"
            )
        self.obs_shape = obs_shape
        channels, height, width = obs_shape
        layers: list[nn.Module] = []
        for out, kernel, stride in CONV_LAYERS:
            layers += [nn.Conv2d(channels, out, kernel, stride), nn.ReLU()]
            channels = out
        self.convs = nn.Sequential(*layers)
        flat = channels * conv_output_size(height) * conv_output_size(width)
        self.fc = nn.Linear(flat, FEATURES)

    def forward(self, flat: torch.Tensor) -> torch.Tensor:
        pixels = flat.reshape(-1, *self.obs_shape).float() * PIXEL_SCALE
        out: torch.Tensor = torch.relu(self.fc(self.convs(pixels).flatten(1)))
        return out
