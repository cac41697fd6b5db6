"""A learner's whole state as named arrays, and back: what a population member's exploit copies.

Population-based training (Jaderberg et al. 2017) has a member in the
bottom copy a better one. For the copy to go on where the donor stands,
the online weights are not enough: a DQN also bootstraps from its target
network, steps with Adam's moments, anneals β and times its target updates
by its update count, and learns from its replay; PPO steps with Adam and
anneals its learning rate by the env steps it has learned from. So the
copy takes all of it:

- `target/<name>`: the DQN target network's parameters and buffers;
- `optimizer/<index>/<key>`: Adam's per-parameter state (`step`,
  `exp_avg`, `exp_avg_sq`), by the parameter's position;
- `position/<counter>`: the schedules' clocks (DQN: `updates`; PPO:
  `updates`, `rounds`, `env_steps`);
- `replay/<column>`: the newest transitions of the DQN replay, oldest first
  (fedrl.client.training.transitions.LearnerTransitions' columns).

The online network is the member's model and travels as the model does.
Nothing of the member's own stays but what makes it a member: its env
stream and counters, its evaluation seeds, its optimizer's settings (the
new learning rate arrives with the explored hyperparameters), PPO's
minibatch order, and its own replay, which the donor's transitions join as
the newest (displacing the oldest when it is full).

Plain arrays only (int64 counters, float32 state, the replay's own
dtypes), so a state crosses the wire as any tensor list does
(fedrl.common.chunking), never pickled. Importing checks every name, shape
and dtype against the receiving learner before it changes anything, and
then goes through the learner's own `load_state_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fedrl.client.training.learner import Learner
from fedrl.client.training.ppo_learner import PPOLearner
from fedrl.client.training.transitions import LearnerTransitions

NamedArrays = list[tuple[str, np.ndarray]]

TARGET, OPTIMIZER, POSITION, REPLAY = "target/", "optimizer/", "position/", "replay/"
REPLAY_COLUMNS = ("obs", "action", "reward", "next_obs", "discount")
ADAM_KEYS = frozenset({"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"})
DQN_POSITIONS = ("updates",)
PPO_POSITIONS = ("updates", "rounds", "env_steps")


def export_learner(
    learner: Learner | PPOLearner, *, replay_transitions: int, max_replay_bytes: int = 1 << 62
) -> NamedArrays:
    """The learner's state beside its online weights (module docstring), with the newest
    `replay_transitions` transitions of a DQN replay (0: none), as many of them as fit in
    `max_replay_bytes` (frame stacks are large: 56 KB a transition on Atari)."""
    if replay_transitions < 0:
        raise ValueError(f"replay_transitions must be >= 0, got {replay_transitions}")
    if isinstance(learner, Learner):
        # obs and next_obs, the int64 action, the float32 reward and discount.
        per_transition = 2 * int(np.prod(learner.obs_shape)) * learner.obs_dtype.itemsize + 16
        replay_transitions = min(replay_transitions, max_replay_bytes // per_transition)
    state = learner.state_dict()
    arrays: NamedArrays = []
    if isinstance(learner, Learner):
        arrays += [(TARGET + name, _array(value)) for name, value in state["target"].items()]
    for index, entry in sorted(state["optimizer"]["state"].items()):
        for key, value in sorted(entry.items()):
            arrays.append((f"{OPTIMIZER}{index}/{key}", _array(value)))
    positions = DQN_POSITIONS if isinstance(learner, Learner) else PPO_POSITIONS
    arrays += [(POSITION + name, np.asarray(int(state[name]), np.int64)) for name in positions]
    if isinstance(learner, Learner) and replay_transitions:
        recent = learner.replay.recent(replay_transitions)
        arrays += [(REPLAY + column, getattr(recent, column)) for column in REPLAY_COLUMNS]
    return arrays


def import_learner(
    learner: Learner | PPOLearner,
    model: Sequence[tuple[str, np.ndarray]],
    state: Sequence[tuple[str, np.ndarray]],
) -> int:
    """Make `learner` the learner `model` and `state` (export_learner's) describe; returns the
    transitions added to its replay. ValueError, changing nothing, if they do not fit it."""
    parts = _split(state)
    own = learner.state_dict()
    is_dqn = isinstance(learner, Learner)
    net_key = "online" if is_dqn else "net"
    nets = {net_key: _model_state(learner.online, own[net_key], model)}
    if is_dqn:
        nets["target"] = _tensors("target network", own["target"], parts["target"])
    elif parts["target"]:
        raise ValueError("a PPO learner has no target network, but the state carries one")
    optimizer = _optimizer_state(learner.optimizer, parts["optimizer"])
    positions = _positions(parts["position"], DQN_POSITIONS if is_dqn else PPO_POSITIONS)
    replay = None
    if isinstance(learner, Learner):
        replay = _replay(learner, parts["replay"])
    elif parts["replay"]:
        raise ValueError("a PPO learner keeps no replay, but the state carries one")
    # The learner's own load checks the networks and the optimizer again before it writes.
    learner.load_state_dict(
        {
            **own,
            **nets,
            "optimizer": {"state": optimizer, "param_groups": own["optimizer"]["param_groups"]},
            **positions,
        }
    )
    if replay is None or not len(replay):
        return 0
    assert isinstance(learner, Learner)
    learner.add(replay)
    return len(replay)


def _split(state: Sequence[tuple[str, np.ndarray]]) -> dict[str, dict[str, np.ndarray]]:
    """The state's arrays by part, each named without its part's prefix."""
    parts: dict[str, dict[str, np.ndarray]] = {
        "target": {},
        "optimizer": {},
        "position": {},
        "replay": {},
    }
    for name, array in state:
        part, _, rest = name.partition("/")
        if part not in parts or not rest:
            raise ValueError(
                f"learner state entry {name!r} is none of target/, optimizer/, position/, replay/"
            )
        if rest in parts[part]:
            raise ValueError(f"learner state entry {name!r} appears twice")
        parts[part][rest] = np.asarray(array)
    return parts


def _model_state(
    network: torch.nn.Module,
    own: Mapping[str, torch.Tensor],
    model: Sequence[tuple[str, np.ndarray]],
) -> dict[str, torch.Tensor]:
    """The online network's state with the model's parameters in it (its buffers are its own)."""
    given = dict(model)
    if len(given) != len(model):
        raise ValueError("the model names a tensor twice")
    parameters = {name: own[name] for name, _ in network.named_parameters()}
    return {**own, **_tensors("model", parameters, given)}


def _tensors(
    what: str, own: Mapping[str, torch.Tensor], given: Mapping[str, np.ndarray]
) -> dict[str, torch.Tensor]:
    """`given` as tensors shaped and typed as `own`, with exactly its names."""
    if set(given) != set(own):
        missing, extra = sorted(set(own) - set(given)), sorted(set(given) - set(own))
        raise ValueError(f"the {what} does not fit: missing {missing[:4]}, unknown {extra[:4]}")
    tensors = {}
    for name, reference in own.items():
        array = given[name]
        if tuple(array.shape) != tuple(reference.shape):
            raise ValueError(
                f"the {what}'s {name!r} has shape {list(array.shape)}, "
                f"this learner's {list(reference.shape)}"
            )
        _check_values(f"the {what}'s {name!r}", array, floating=reference.is_floating_point())
        tensors[name] = torch.from_numpy(np.array(array)).to(reference.dtype)
    return tensors


def _optimizer_state(
    optimizer: torch.optim.Optimizer, given: Mapping[str, np.ndarray]
) -> dict[int, dict[str, torch.Tensor]]:
    """Adam's per-parameter state from `optimizer/<index>/<key>` arrays, checked against the
    parameters it would belong to (Adam's own load does not look at the shapes)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, array in given.items():
        index_text, _, key = name.partition("/")
        if not index_text.isdigit() or int(index_text) >= len(params) or key not in ADAM_KEYS:
            raise ValueError(
                f"optimizer state entry {name!r} names no Adam state of this learner's "
                f"{len(params)} parameters"
            )
        index = int(index_text)
        expected = () if key == "step" else tuple(params[index].shape)
        if tuple(array.shape) != expected:
            raise ValueError(
                f"optimizer state {name!r} has shape {list(array.shape)}, expected {list(expected)}"
            )
        _check_values(f"optimizer state {name!r}", array, floating=True)
        state.setdefault(index, {})[key] = torch.from_numpy(np.array(array, dtype=np.float32))
    needed = {"step", "exp_avg", "exp_avg_sq"}
    partial = sorted(i for i, entry in state.items() if not needed <= entry.keys())
    if partial:
        raise ValueError(f"optimizer state of parameters {partial[:4]} is incomplete")
    return state


def _positions(given: Mapping[str, np.ndarray], names: tuple[str, ...]) -> dict[str, int]:
    if set(given) != set(names):
        raise ValueError(
            f"the learner state's positions are {sorted(given)}, expected {list(names)}"
        )
    positions = {}
    for name in names:
        array = given[name]
        if array.shape != () or array.dtype.kind not in "iu" or int(array) < 0:
            raise ValueError(f"position {name!r} must be one whole number >= 0")
        positions[name] = int(array)
    return positions


def _replay(learner: Learner, given: Mapping[str, np.ndarray]) -> LearnerTransitions | None:
    """The replay's transitions, checked as the learner checks any it takes in."""
    if not given:
        return None
    if set(given) != set(REPLAY_COLUMNS):
        raise ValueError(
            f"the replay sample has columns {sorted(given)}, expected {list(REPLAY_COLUMNS)}"
        )
    batch = LearnerTransitions(**{column: given[column] for column in REPLAY_COLUMNS})
    batch.validate(learner.obs_shape, learner.obs_dtype)
    if len(batch) and batch.action.max() >= learner.n_actions:
        raise ValueError(
            f"the replay sample's action {batch.action.max()} is out of range for "
            f"{learner.n_actions} actions"
        )
    return batch


def _check_values(what: str, array: np.ndarray, *, floating: bool) -> None:
    """Floating values where floats belong, all finite; whole numbers where they do."""
    if floating and array.dtype.kind != "f":
        raise ValueError(f"{what} is {array.dtype}, not floating point")
    if not floating and array.dtype.kind not in "iub":
        raise ValueError(f"{what} is {array.dtype}, not whole numbers")
    if floating and not np.isfinite(array).all():
        raise ValueError(f"{what} holds a NaN or infinite value")


def _array(value: Any) -> np.ndarray:
    """A state dict's tensor as a float32 array (integer tensors keep their kind as int64)."""
    tensor = value.detach().to("cpu")
    kind = torch.float32 if tensor.is_floating_point() else torch.int64
    array: np.ndarray = tensor.to(kind).numpy().copy()
    return array
