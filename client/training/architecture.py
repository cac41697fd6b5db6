"""A saved model's network, rebuilt from its named tensors alone.

Model files (a state dir's model.pt and best.pt, a server's vNNNNNNNN.npz)
hold named tensors and nothing that runs. Every network fedrl builds can be
read back from those names and shapes: the algorithm from the heads (DQN's
`head`/`value`+`advantage`, PPO's `policy.`/`value.`), the torso from its
layers (an MLP's `N.weight`, a transformer's `embed`, `position` and
`blocks.N`; the transformer's head count follows from its width; the Nature
CNN's `convs.N` and `fc`), and the
action space from the output (a Gaussian policy has `log_std`). So export,
backtest and plot need no separate record of how a model was configured.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from torch import nn

from fedrl.client.training.cnn import CONV_LAYERS, conv_output_size, is_image, smallest_input
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.obs_window import windowed_shape
from fedrl.client.training.policy_network import build_actor_critic
from fedrl.client.training.q_network import build_q_network, load_named_arrays
from fedrl.client.training.vector_env import EnvShape

NamedArrays = list[tuple[str, npt.NDArray[Any]]]
_MLP_LAYER = re.compile(r"(\d+)\.weight")
_BLOCK = re.compile(r"blocks\.(\d+)\.qkv\.weight")


class ArchitectureError(ValueError):
    """The tensors are not a network fedrl builds."""


@dataclass(frozen=True)
class Architecture:
    """A network's kind and sizes, as its tensors tell them."""

    algorithm: Literal["dqn", "ppo"]
    network: NetworkConfig
    """The torso: MLP or transformer, with its sizes."""
    hidden: tuple[int, ...]
    """MLP widths (empty for the transformer)."""
    dueling: bool
    """DQN: separate value and advantage heads."""
    obs_dim: int
    """Features per observation (flattened)."""
    n_actions: int
    """Discrete actions; 0 for a Gaussian policy over Box actions."""
    action_dim: int
    """Box actions' dimensions; 0 for Discrete."""
    image_shape: tuple[int, ...] = ()
    """The CNN's input [C, H, W] (the smallest H and W that fit its layers); () for other
    torsos."""

    @property
    def window(self) -> int:
        """Observations per input: the transformer's context, or 0."""
        return self.network.window

    def input_shape(self, obs_shape: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The network's input per sample for the env's `obs_shape`: the observation, or its
        window; without an env, what the tensors say."""
        observation = obs_shape if obs_shape is not None else (self.image_shape or (self.obs_dim,))
        return windowed_shape(observation, self.window) if self.window else observation

    def fits(self, shape: EnvShape) -> str | None:
        """Why this network cannot act in an env of `shape`, or None if it can."""
        if (self.n_actions, self.action_dim) != (shape.n_actions, shape.action_dim):
            return (
                f"the env has {_actions(shape.n_actions, shape.action_dim)}, "
                f"the network {_actions(self.n_actions, self.action_dim)}"
            )
        if self.image_shape:
            return _image_fits(self.image_shape, shape.obs_shape)
        observation = shape.obs_shape[1:] if self.window else shape.obs_shape
        # A window's last feature is its step flag.
        features = int(np.prod(observation)) - (1 if self.window else 0)
        if features != self.obs_dim:
            return (
                f"the network reads {self.obs_dim} features per observation, "
                f"the env's observations have {features}"
            )
        return None


def _image_fits(image: tuple[int, ...], obs_shape: tuple[int, ...]) -> str | None:
    """Why a CNN made for `image` cannot read observations of `obs_shape`, or None."""
    if not is_image(obs_shape):
        return f"the network reads images of shape {image}, the env's observations are {obs_shape}"
    if obs_shape[0] != image[0] or tuple(map(conv_output_size, obs_shape[1:])) != tuple(
        map(conv_output_size, image[1:])
    ):
        return f"the network reads images of shape {image}, the env's are {obs_shape}"
    return None


def _actions(n_actions: int, action_dim: int) -> str:
    return f"{n_actions} discrete actions" if n_actions else f"{action_dim}-dimensional Box actions"


def infer_architecture(tensors: NamedArrays | Mapping[str, Any]) -> Architecture:
    """The architecture of a DQN Q-network or a PPO actor-critic; ArchitectureError otherwise."""
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    shapes = {name: tuple(int(d) for d in array.shape) for name, array in items}
    ppo = "policy.head.weight" in shapes
    torso = "policy.torso." if ppo else "torso."
    image = _image_input(shapes, torso)
    hidden: tuple[int, ...]
    if image:
        network, hidden, obs_dim = NetworkConfig(), (), int(np.prod(image))
    else:
        network, hidden, obs_dim = _torso(shapes, torso)
    if ppo:
        out = shapes["policy.head.weight"][0]
        box = "log_std" in shapes
        return Architecture(
            algorithm="ppo",
            network=network,
            hidden=hidden,
            dueling=False,
            obs_dim=obs_dim,
            n_actions=0 if box else out,
            action_dim=out if box else 0,
            image_shape=image,
        )
    dueling = "advantage.weight" in shapes and "value.weight" in shapes
    head = shapes.get("advantage.weight" if dueling else "head.weight")
    if head is None or len(head) != 2:
        raise ArchitectureError(_not_ours(shapes))
    return Architecture(
        algorithm="dqn",
        network=network,
        hidden=hidden,
        dueling=dueling,
        obs_dim=obs_dim,
        n_actions=head[0],
        action_dim=0,
        image_shape=image,
    )


def _image_input(shapes: dict[str, tuple[int, ...]], prefix: str) -> tuple[int, ...]:
    """The input [C, H, W] of a Nature CNN torso under `prefix`; () if the torso is not one.

    The channels are the first filter's; H and W the smallest that give the
    last convolution's output, which the fully connected layer's width says
    (square, as every Atari stack is: 84×84 for the Nature CNN's 7×7).
    """
    first = shapes.get(prefix + "convs.0.weight")
    fc = shapes.get(prefix + "fc.weight")
    if first is None or fc is None:
        return ()
    if len(first) != 4 or len(fc) != 2:
        raise ArchitectureError(_not_ours(shapes))
    side = math.isqrt(fc[1] // CONV_LAYERS[-1][0])
    if side < 1 or side * side * CONV_LAYERS[-1][0] != fc[1]:
        raise ArchitectureError(f"a CNN torso whose fully connected layer reads {fc[1]} features")
    return (first[1], smallest_input(side), smallest_input(side))


def _torso(
    shapes: dict[str, tuple[int, ...]], prefix: str
) -> tuple[NetworkConfig, tuple[int, ...], int]:
    embed = shapes.get(prefix + "embed.weight")
    position = shapes.get(prefix + "position")
    if embed is not None and position is not None and len(embed) == 2 and len(position) == 2:
        layers = sum(
            1
            for name in shapes
            if name.startswith(prefix) and _BLOCK.fullmatch(name[len(prefix) :])
        )
        try:
            network = NetworkConfig(
                policy="transformer",
                context=position[0],
                transformer_layers=layers,
                transformer_width=embed[0],
            )
        except ValueError as exc:
            raise ArchitectureError(f"a transformer torso of unexpected shape: {exc}") from exc
        return network, (), embed[1]
    layers_by_index = sorted(
        (int(m[1]), shapes[name])
        for name in shapes
        if name.startswith(prefix) and (m := _MLP_LAYER.fullmatch(name[len(prefix) :]))
    )
    if any(len(shape) != 2 for _, shape in layers_by_index):
        raise ArchitectureError(_not_ours(shapes))
    hidden = tuple(shape[0] for _, shape in layers_by_index)
    if layers_by_index:
        return NetworkConfig(), hidden, layers_by_index[0][1][1]
    # No hidden layer: the head reads the observation itself.
    head = shapes.get("policy.head.weight" if prefix == "policy.torso." else "head.weight")
    head = head or shapes.get("advantage.weight")
    if head is None or len(head) != 2:
        raise ArchitectureError(_not_ours(shapes))
    return NetworkConfig(), (), head[1]


def _not_ours(shapes: dict[str, tuple[int, ...]]) -> str:
    names = ", ".join(list(shapes)[:6])
    return (
        "these tensors are not a fedrl Q-network or actor-critic (a Q-network has torso.N.weight "
        "and head.weight or advantage.weight and value.weight; an actor-critic has policy.* and "
        f"value.*); found: {names}"
    )


def build_from_tensors(
    tensors: NamedArrays, obs_shape: tuple[int, ...], shape: EnvShape | None = None
) -> nn.Module:
    """The saved network in eval mode, loaded strictly (every name and shape must fit).

    `obs_shape` is what the network reads (the window for a transformer);
    `shape` gives a Gaussian policy its action bounds (unbounded without it).
    """
    arch = infer_architecture(tensors)
    if shape is None:
        shape = EnvShape(
            obs_shape=obs_shape,
            n_actions=arch.n_actions,
            action_low=(-np.inf,) * arch.action_dim,
            action_high=(np.inf,) * arch.action_dim,
        )
    problem = arch.fits(shape)
    if problem is not None:
        raise ArchitectureError(f"{problem}; is this the env the model was trained on?")
    net: nn.Module
    if arch.algorithm == "ppo":
        net = build_actor_critic(obs_shape, shape, hidden=arch.hidden, network=arch.network)
    else:
        net = build_q_network(
            obs_shape,
            arch.n_actions,
            hidden=arch.hidden,
            dueling=arch.dueling,
            network=arch.network,
            action_mask=shape.action_mask,
        )
    # A state dict names a torso shared by two heads under both (value.torso.* as well);
    # the weights are the parameters, each once.
    aliases = set(net.state_dict()) - {name for name, _ in net.named_parameters()}
    try:
        load_named_arrays(net, [(name, array) for name, array in tensors if name not in aliases])
    except ValueError as exc:
        raise ArchitectureError(f"the weights do not fit the network they describe: {exc}") from exc
    return net.eval()
