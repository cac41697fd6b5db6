"""`TrainConfig`: every knob of the training command, and the command-line options made from it.

One frozen dataclass per command (habit from CleanRL): the options, their
defaults and their help text all come from the dataclass fields and the
one-line docstrings under them, so the two cannot drift apart.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import click

from fedrl.client.federation.experience_exchange import ExchangeConfig
from fedrl.client.training.engine import EngineConfig
from fedrl.client.training.learner import LearnerConfig, TargetAtAdoption


@dataclass(frozen=True)
class TrainConfig:
    """The training command: who trains, how long, where state lives, and the engine and learner."""

    participant_id: str = ""
    """Who trains: names the state dir (Unicode allowed). Generated and remembered when absent
    (federated runs; --offline needs one)."""
    server: str = "localhost:7443"
    """Aggregation server as host:port."""
    session: str = "default"
    """Session to join; the first participant creates it."""
    offline: bool = False
    """Train alone, without a server."""
    episodes: int = 1_000
    """Episodes to train in this run; 0 prints the session's status and exits."""
    total_episodes: int = 0
    """Raise the session's total-episodes goal to this before training (0: leave it)."""
    sync_interval: int = 2
    """Episodes between pushes of this participant's progress to the server (at most one
    update is in flight, so a short interval cannot flood the server)."""
    delta_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """Wire type of pushed weight deltas (zstd-compressed in any case)."""
    target_at_adoption: TargetAtAdoption = "reset"
    """Target network when a global model is adopted: reset it to the new model, keep it, or
    shift it by the same change as the online net (see Learner.set_weights for the figures)."""
    ca_cert: str = ""
    """CA certificate (PEM file) that verifies a TLS server; empty for none."""
    bundle: str = ""
    """Participant bundle (PEM file from `fedrl-server issue`) for mutual TLS; empty for none."""
    token_file: str = ""
    """File holding this participant's bearer token (token-mode servers, with --ca-cert); never
    the token itself: the command line is visible in ps."""
    insecure: bool = False
    """Allow plaintext to a server that is not on this machine (everything travels readable)."""
    max_env_steps: int = 0
    """Also stop once this many env steps are done in total; 0 for no limit."""
    state_dir: Path = Path("fedrl-state")
    """Root of the state dirs; this participant's files go to <state-dir>/<participant-id>/."""
    save_model_every: int = 10
    """Episodes between saves of the latest model."""
    save_progress_every: int = 50
    """Episodes between saves of the full progress (optimizer and schedule state too)."""
    log_interval: float = 5.0
    """Seconds between progress lines on stderr."""
    tensorboard: str = ""
    """Directory for TensorBoard event files, one subfolder per participant; empty: the state
    dir, so `tensorboard --logdir <state-dir>` shows every participant as a run; "off": none."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Collection, replay ratio and evaluation."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """The DQN learner."""
    # Experience exchange (federated runs only): the knobs of ExchangeConfig,
    # flat so they read as options of the command itself; see `exchange`.
    foreign_share: float = ExchangeConfig.foreign_share
    """Share of each training batch drawn from other participants' transitions; 0 turns
    experience exchange off."""
    push_transitions: int = ExchangeConfig.push_transitions
    """Most transitions pushed to the session per sync: the newest of those collected since
    the last push, each pushed once."""
    pull_transitions: int = ExchangeConfig.pull_transitions
    """Other participants' transitions asked for per sync."""
    foreign_capacity: int = ExchangeConfig.foreign_capacity
    """Foreign transitions the replay keeps, apart from the local ones."""

    def __post_init__(self) -> None:
        # Building ExchangeConfig checks its knobs: a wrong one fails here, not mid-run.
        _ = self.exchange
        for name in ("save_model_every", "save_progress_every", "sync_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("episodes", "total_episodes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_env_steps < 0:
            raise ValueError(f"max_env_steps must be >= 0, got {self.max_env_steps}")
        if not self.log_interval > 0:
            raise ValueError(f"log_interval must be > 0, got {self.log_interval}")

    @property
    def exchange(self) -> ExchangeConfig:
        """The experience exchange knobs as the client's config (ValueError if one is wrong)."""
        return ExchangeConfig(
            foreign_share=self.foreign_share,
            push_transitions=self.push_transitions,
            pull_transitions=self.pull_transitions,
            foreign_capacity=self.foreign_capacity,
        )


NESTED = ("engine", "learner")
"""TrainConfig fields that are dataclasses of their own; their fields become options too."""
DERIVED = {("learner", "seed")}
"""Fields with no option: the learner's seed comes from the engine's seed stream."""


@dataclass(frozen=True)
class OptionField:
    """One command-line option and the dataclass field it fills."""

    section: str | None
    name: str
    type: Any
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def option_fields() -> list[OptionField]:
    """Every field of TrainConfig and of its nested configs that gets an option, in order."""
    out = list(_fields_of(TrainConfig, None))
    for section in NESTED:
        cls = typing.get_type_hints(TrainConfig)[section]
        out += [f for f in _fields_of(cls, section) if (section, f.name) not in DERIVED]
    seen: dict[str, OptionField] = {}
    for f in out:
        if f.name in seen:
            raise TypeError(f"option name {f.name!r} is a field of two configs; rename one")
        seen[f.name] = f
    return out


def _fields_of(cls: type, section: str | None) -> Iterator[OptionField]:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if section is None and f.name in NESTED:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"{cls.__name__}.{f.name} needs a default to become an option")
        yield OptionField(section, f.name, hints[f.name], default, docs.get(f.name, ""))


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


class _IntTuple(click.ParamType[Any]):
    name = "INTS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        try:
            return tuple(int(part) for part in str(value).split(",") if part.strip())
        except ValueError:
            self.fail(f"expected comma-separated integers such as 256,256, got {value!r}")


class _Optional(click.ParamType[Any]):
    """A number, or "none" for a knob that can be switched off."""

    def __init__(self, inner: click.ParamType[Any]) -> None:
        self.inner = inner
        self.name = f"{inner.name}|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        return self.inner.convert(value, param, ctx)


def _click_type(hint: Any) -> click.ParamType[Any]:
    origin = typing.get_origin(hint)
    if hint is int:
        return click.INT
    if hint is float:
        return click.FLOAT
    if hint is str:
        return click.STRING
    if hint is Path:
        return click.Path(path_type=Path, file_okay=False)
    if origin is Literal:
        return click.Choice([str(a) for a in typing.get_args(hint)])
    if origin is tuple and typing.get_args(hint) == (int, ...):
        return _IntTuple()
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) == 1:
            return _Optional(_click_type(inner[0]))
    raise TypeError(f"no command-line type for {hint!r}; extend _click_type")


def _click_default(default: Any) -> Any:
    # Click reads a tuple default as several values; the option takes one
    # comma-separated string. An empty required text has no default to show.
    if isinstance(default, tuple):
        return ",".join(str(d) for d in default)
    return None if default == "" else default


def train_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Adds one option per config field to a click command."""
    for f in reversed(option_fields()):
        if f.type is bool:
            option = click.option(
                f"{f.flag}/--no-{f.flag[2:]}",
                f.name,
                default=f.default,
                help=f.help,
                show_default=True,
            )
        else:
            option = click.option(
                f.flag,
                f.name,
                type=_click_type(f.type),
                default=_click_default(f.default),
                help=f.help,
                show_default=f.default not in ("", None),
            )
        command = option(command)
    return command


def config_from_options(options: dict[str, Any]) -> TrainConfig:
    """TrainConfig from the options' values; ValueError says which value is wrong."""
    sections: dict[str | None, dict[str, Any]] = {None: {}, **{s: {} for s in NESTED}}
    for f in option_fields():
        if f.name in options:
            sections[f.section][f.name] = options[f.name]
    nested: dict[str, Any] = {
        "engine": EngineConfig(**sections["engine"]),
        "learner": LearnerConfig(**sections["learner"]),
    }
    return TrainConfig(**sections[None], **nested)
