"""The session's rules: what every member of a session does alike, fixed when it is created.

How a group learns depends on choices that only work when every member makes
the same one: what is shared, when and how members sync (asynchronously, or
in rounds from a number of members on), the wire type of weight deltas, and
the credit others' experience earns. They are the session's configuration
(Flower's `configure_fit` is the model: the server tells clients how to
train), not each member's:

- `GroupRules` is a session's rules. The server's defaults for new sessions
  are one (`fedrl-server --rounds-from ...`, the ServerConfig's `rules`
  section), the server may fix a session's value (`--session-rule`), and the
  session's first participant's explicit choices fix the rest when its Join
  creates the session. The session keeps them in the state database and
  sends them with every JoinReply.
- `RuleChoices` is what one participant chose explicitly (its command's
  options: None where left to the session). A later member whose choice
  differs from the session's is refused (`refusal`), naming both values; a
  member that chose nothing takes the session's.

Three rules are "automatic" when left unset (None in GroupRules): their value
then follows whether a member syncs in rounds or asynchronously, as the
constants below say (fedrl.client.federation.sync_plan resolves them). What a
member's own machine decides (workers, device, envs, its learner's replay
ratio, how many transitions it pushes and pulls per sync, whether it learns
or only acts) stays out of the rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from fedrl.common.config_cli import doc

Share = Literal["weights", "experience", "both"]
"""What the members of a session share."""
SHARES: tuple[Share, ...] = ("weights", "experience", "both")
DeltaDtype = Literal["bfloat16", "float16", "float32"]
DELTA_DTYPES: tuple[DeltaDtype, ...] = ("bfloat16", "float16", "float32")
"""Wire types a weight delta may travel in."""

ROUNDS_FROM = 2
"""Members pushing weights from which a group syncs in rounds unless chosen otherwise: from
two, since pairs in rounds reached the target sooner than asynchronous pairs, whose global
model wobbled around it (docs/benchmarks.md, federation)."""
ROUND_STEPS = 128
"""Env steps per synchronous round unless given (a sync per 8 steps of 16 envs)."""
ROUND_WAIT_S = 5.0
"""Longest wait for a round's version unless given (warmup rounds included): the server's
default buffer timeout, after which a version forms without a silent member."""
ROUND_DELTA_DTYPE: DeltaDtype = "float32"
"""Rounds' default: a round's delta holds only ROUND_STEPS env steps of updates and is averaged
as soon as it is sent, so it goes whole rather than rounded to bfloat16's 8 bits of mantissa
(docs/benchmarks.md, weight deltas)."""
ASYNC_DELTA_DTYPE: DeltaDtype = "bfloat16"
"""Asynchronous syncs' default: their deltas span many updates, and the measured defaults
(pairs on both tasks) used it; half the bytes of float32."""
FOREIGN_CREDIT = 1.0
"""Replay-ratio credit of another member's transition, asynchronously: as much as one's own.
A learner's updates then grow with all the data the group collects, as an Ape-X learner's do
with its actors', while a member's updates per own env step stay at the replay ratio times the
group's size. More credit buys updates that a lone learner given the same compute makes as
well (docs/benchmarks.md, federation)."""
ROUND_FOREIGN_CREDIT = 1.0
"""The same in rounds (docs/benchmarks.md, federation)."""

MAX_CREDIT = 1_000.0
"""Largest credit a session takes: a thousand updates per received transition is far past any
useful setting, and a bound keeps a typo from stalling every member's learner."""
MAX_ROUND_WAIT_S = 86_400.0
"""Longest round wait a session takes (a day)."""
MAX_COUNT = 2**32 - 1
"""Largest sync interval and rounds_from (their wire type is uint32)."""
MAX_STEPS = 2**63 - 1
"""Largest sync_steps (the protocol's counts stop at 2^63 - 1)."""

RuleValue = str | int | float | bool | None


class RulesError(ValueError):
    """Rules that cannot be a session's: the message names the rule and what it takes."""


@dataclass(frozen=True)
class GroupRules:
    """A session's rules. As the server's `rules` section, the defaults of a new session."""

    share: Share = field(
        default="both",
        metadata=doc(
            "What a new session's members share: weights (deltas averaged into global "
            "versions), experience (transitions; each keeps its own model) or both."
        ),
    )
    sync_interval: int = field(
        default=2,
        metadata=doc(
            "Episodes between a member's pushes while it syncs asynchronously (below "
            "--rounds-from members pushing weights, or with --round-wait-s 0).",
            formerly=("serve",),
        ),
    )
    sync_steps: int | None = field(
        default=None,
        metadata=doc(
            f"Env steps between syncs: a round's length, and asynchronously a push once this "
            f"many steps passed if that comes before --sync-interval's episodes (0: episodes "
            f"only). none: automatic, {ROUND_STEPS} in rounds and 0 asynchronously."
        ),
    )
    round_wait_s: float | None = field(
        default=None,
        metadata=doc(
            f"Longest wait, in seconds, for the version holding a round's push (every member "
            f"starts each round from the same average); 0: asynchronous at any size. none: "
            f"automatic, {ROUND_WAIT_S:g} s wherever rounds can form (DQN sharing weights), "
            f"else 0."
        ),
    )
    rounds_from: int = field(
        default=ROUNDS_FROM,
        metadata=doc(
            "Members pushing weights from which the group syncs in rounds (asynchronously "
            "while fewer do; docs/federation.md); 1: rounds at any size."
        ),
    )
    shared_warmup: bool = field(
        default=True,
        metadata=doc(
            "DQN members sharing both sync in rounds until their learner starts, so that the "
            "group's experience fills every replay together."
        ),
    )
    delta_dtype: DeltaDtype | None = field(
        default=None,
        metadata=doc(
            f"Wire type of weight deltas. none: automatic, {ROUND_DELTA_DTYPE} in rounds and "
            f"{ASYNC_DELTA_DTYPE} asynchronously."
        ),
    )
    foreign_credit: float = field(
        default=FOREIGN_CREDIT,
        metadata=doc(
            "Gradient updates another member's transition earns, as a share of a local env "
            "step's (1: the same as one's own; 0: none), while syncing asynchronously."
        ),
    )
    round_foreign_credit: float = field(
        default=ROUND_FOREIGN_CREDIT,
        metadata=doc("--foreign-credit while members sync in rounds."),
    )
    credit_at_own_pace: bool = field(
        default=True,
        metadata=doc(
            "Of each other member's transitions, only as many as the receiver collected "
            "itself earn credit, so a slower member is not owed ever more updates."
        ),
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check_rule(f.name, getattr(self, f.name))
        if self.round_wait_s is not None and self.round_wait_s > 0:
            if self.share == "experience":
                raise RulesError(
                    "synchronous rounds (--round-wait-s) wait for the global version holding "
                    "each push: they need --share weights or both"
                )
            if self.sync_steps == 0:
                raise RulesError(
                    "synchronous rounds are counted in env steps, so that every member pushes "
                    "at the same steps: give --sync-steps (e.g. 128) with --round-wait-s"
                )

    def with_choices(self, choices: RuleChoices) -> GroupRules:
        """These rules with `choices` made; RulesError if the two do not go together."""
        return dataclasses.replace(self, **choices.chosen())

    def differing(self, choices: RuleChoices) -> list[str]:
        """The rules `choices` chose otherwise than these, in field order."""
        return [name for name, value in choices.chosen().items() if getattr(self, name) != value]


@dataclass(frozen=True)
class RuleChoices:
    """The session's rules one participant chose explicitly; None: the session's.

    As fedrl-client's rules section. A config file a run recorded before the rules were the
    session's has them in its [federation] and [exchange] tables (`formerly`): it still
    reads, its values chosen explicitly, so it joins a session that agrees with them.
    """

    share: Share | None = field(
        default=None,
        metadata=doc(
            "What the session's members share: weights (deltas averaged into global "
            "versions), experience (transitions; each keeps its own model) or both. "
            "Default: the session's (both unless its server says otherwise).",
            formerly=("federation",),
        ),
    )
    sync_interval: int | None = field(
        default=None,
        metadata=doc(
            "Episodes between pushes while syncing asynchronously (below --rounds-from "
            "members pushing weights, or with --round-wait-s 0). Default: the session's (2). "
            "PPO pushes after every rollout update.",
            formerly=("federation",),
        ),
    )
    sync_steps: int | None = field(
        default=None,
        metadata=doc(
            f"DQN: env steps between syncs: a round's length, and asynchronously a push once "
            f"this many steps passed if that comes before --sync-interval's episodes (0: "
            f"episodes only). Default: the session's (automatic: {ROUND_STEPS} in rounds, 0 "
            f"asynchronously).",
            formerly=("federation",),
        ),
    )
    round_wait_s: float | None = field(
        default=None,
        metadata=doc(
            f"DQN, synchronous rounds: every --sync-steps env steps push, wait up to this many "
            f"seconds for the version holding that push, adopt it and the round's "
            f"experience, so that every member starts each round from the same average; 0: "
            f"asynchronous at any size. Default: the session's (automatic: {ROUND_WAIT_S:g} s "
            f"wherever rounds can form, from --rounds-from members).",
            formerly=("federation",),
        ),
    )
    rounds_from: int | None = field(
        default=None,
        metadata=doc(
            f"Sync in rounds only while at least this many members push weights (the server's "
            f"count of those it heard from within its --active-window-s), asynchronously while "
            f"fewer do; 1: rounds at any size. Default: the session's ({ROUNDS_FROM}).",
            formerly=("federation",),
        ),
    )
    shared_warmup: bool | None = field(
        default=None,
        metadata=doc(
            "DQN sharing both: sync in rounds until the learner starts, so that the group's "
            "experience fills every member's replay together. Default: the session's (on).",
            formerly=("federation",),
        ),
    )
    delta_dtype: DeltaDtype | None = field(
        default=None,
        metadata=doc(
            f"Wire type of pushed weight deltas (zstd-compressed in any case). Default: the "
            f"session's (automatic: {ROUND_DELTA_DTYPE} in rounds, {ASYNC_DELTA_DTYPE} "
            f"asynchronously).",
            formerly=("federation",),
        ),
    )
    foreign_credit: float | None = field(
        default=None,
        metadata=doc(
            f"DQN: gradient updates each of another participant's transitions earns, as a "
            f"share of a local env step's (--replay-ratio): 1 replays everyone's data alike, 2 "
            f"the others' twice as often; 0 adds them at the local pace. Default: the "
            f"session's ({FOREIGN_CREDIT:g}).",
            formerly=("exchange",),
        ),
    )
    round_foreign_credit: float | None = field(
        default=None,
        metadata=doc(
            f"DQN: --foreign-credit while syncing in rounds, where members average updates "
            f"made on the same data. Default: the session's ({ROUND_FOREIGN_CREDIT:g}).",
            formerly=("exchange",),
        ),
    )
    credit_at_own_pace: bool | None = field(
        default=None,
        metadata=doc(
            "DQN: of each other participant's transitions, only as many as this one collected "
            "itself earn --foreign-credit, so a slower member keeps stepping its envs instead "
            "of owing ever more updates. Default: the session's (on).",
            formerly=("exchange",),
        ),
    )

    def __post_init__(self) -> None:
        for name, value in self.chosen().items():
            check_rule(name, value)

    def chosen(self) -> dict[str, Any]:
        """The rules chosen, by name, in field order."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }

    def only(self, names: Iterable[str]) -> RuleChoices:
        """These choices of the rules in `names` alone."""
        keep = set(names)
        kept = {name: value for name, value in self.chosen().items() if name in keep}
        return dataclasses.replace(RuleChoices(), **kept)

    def over(self, other: RuleChoices) -> RuleChoices:
        """These choices, and `other`'s for the rules these leave open."""
        return dataclasses.replace(other, **self.chosen())


RULE_NAMES = tuple(f.name for f in dataclasses.fields(GroupRules))


def check_rule(name: str, value: Any) -> None:
    """RulesError unless `value` is one rule `name` may take (None: automatic, where it may be)."""
    if name not in _CHECKS:
        raise RulesError(f"{name!r} is not one of the session's rules: {', '.join(RULE_NAMES)}")
    if value is None and name in AUTOMATIC:
        return
    problem = _CHECKS[name](value)
    if problem:
        raise RulesError(f"{name} {problem}, got {value!r}")


def _one_of(values: tuple[str, ...]) -> Callable[[Any], str]:
    return lambda v: "" if isinstance(v, str) and v in values else f"must be one of {values}"


def _count(low: int, high: int) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if isinstance(v, int) and not isinstance(v, bool) and low <= v <= high:
            return ""
        return f"must be a whole number in {low}..{high}"

    return check


def _number(high: float) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= high:
            return ""
        return f"must be a number in 0..{high:g}"

    return check


def _flag(v: Any) -> str:
    return "" if isinstance(v, bool) else "must be true or false"


_CHECKS: dict[str, Callable[[Any], str]] = {
    "share": _one_of(SHARES),
    "sync_interval": _count(1, MAX_COUNT),
    "sync_steps": _count(0, MAX_STEPS),
    "round_wait_s": _number(MAX_ROUND_WAIT_S),
    "rounds_from": _count(1, MAX_COUNT),
    "shared_warmup": _flag,
    "delta_dtype": _one_of(DELTA_DTYPES),
    "foreign_credit": _number(MAX_CREDIT),
    "round_foreign_credit": _number(MAX_CREDIT),
    "credit_at_own_pace": _flag,
}
AUTOMATIC = frozenset({"sync_steps", "round_wait_s", "delta_dtype"})
"""The rules that may be left automatic (None)."""


# What a rule means, for refusals, status tables and the dashboard.


def shown(value: RuleValue) -> str:
    """A rule's value as a status table shows it: "auto" for automatic, "on"/"off"."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def flag(name: str, value: RuleValue) -> str:
    """Rule `name` at `value` as its option says it, e.g. "--rounds-from 3",
    "--no-shared-warmup", "--sync-steps automatic" (fedrl-server's `--sync-steps none`)."""
    option = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return option if value else "--no-" + option[2:]
    return f"{option} {'automatic' if value is None else shown(value)}"


def meaning(name: str, value: RuleValue) -> str:
    """What rule `name` at `value` makes the group do, in words."""
    if name == "share":
        return {
            "weights": "members share weights (deltas averaged into global versions)",
            "experience": "members share experience (each keeps its own model)",
            "both": "members share weights and experience",
        }[str(value)]
    if name == "sync_interval":
        return f"asynchronous pushes every {value} episodes"
    if name == "sync_steps":
        if value is None:
            return f"rounds of {ROUND_STEPS} env steps, asynchronous pushes by episodes"
        if value == 0:
            return "asynchronous pushes by episodes only"
        return f"a sync every {value} env steps, in rounds and asynchronously"
    if name == "round_wait_s":
        if value is None:
            return f"up to {ROUND_WAIT_S:g} s per round wherever rounds can form"
        if value == 0:
            return "asynchronous at any size: no rounds"
        return f"up to {shown(value)} s per round's version"
    if name == "rounds_from":
        return "rounds at any size" if value == 1 else f"rounds from {value} members pushing"
    if name == "shared_warmup":
        return "rounds until each learner starts" if value else "no rounds before learning"
    if name == "delta_dtype":
        if value is None:
            return f"{ROUND_DELTA_DTYPE} in rounds, {ASYNC_DELTA_DTYPE} asynchronously"
        return f"weight deltas travel as {value}"
    if name in ("foreign_credit", "round_foreign_credit"):
        when = "in rounds" if name == "round_foreign_credit" else "asynchronously"
        return f"another member's transition earns {shown(value)}x a local step's updates {when}"
    if name == "credit_at_own_pace":
        if value:
            return "others' transitions earn credit up to the receiver's own count"
        return "every received transition earns credit"
    raise RulesError(f"{name!r} is not one of the session's rules")


def described(rules: GroupRules) -> list[tuple[str, str, str]]:
    """(option, value, meaning) of every rule, in field order."""
    return [
        ("--" + name.replace("_", "-"), shown(value), meaning(name, value))
        for name, value in ((name, getattr(rules, name)) for name in RULE_NAMES)
    ]


def in_one_line(rules: GroupRules) -> str:
    """The rules as their options say them, e.g. "--share both --sync-interval 2 ..."."""
    return " ".join(flag(name, getattr(rules, name)) for name in RULE_NAMES)


def refusal(session: str, rules: GroupRules, choices: RuleChoices) -> str | None:
    """Why a participant with `choices` cannot join a session with `rules`; None if it can.

    For every rule they differ on: the session's value and the participant's, each as its
    option, and what the session's does.
    """
    differing = rules.differing(choices)
    if not differing:
        return None
    chosen = choices.chosen()
    parts = [
        f"{flag(name, getattr(rules, name))} ({meaning(name, getattr(rules, name))}), "
        f"you asked for {flag(name, chosen[name])}"
        for name in differing
    ]
    drop = "the flag" if len(differing) == 1 else "those flags"
    return f"session {session!r} has " + "; ".join(parts) + f": drop {drop} or join another session"


def parse_choice(name: str, text: str) -> RuleChoices:
    """One rule written as text (`rounds-from`, `2`), as choices; RulesError saying why not."""
    key = name.strip().replace("-", "_")
    if key not in RULE_NAMES:
        raise RulesError(f"{name!r} is not one of the session's rules: {', '.join(RULE_NAMES)}")
    raw = text.strip()
    value: Any
    try:
        if key in ("shared_warmup", "credit_at_own_pace"):
            value = {"true": True, "on": True, "false": False, "off": False}[raw.lower()]
        elif key in ("sync_interval", "sync_steps", "rounds_from"):
            value = int(raw)
        elif key in ("round_wait_s", "foreign_credit", "round_foreign_credit"):
            value = float(raw)
        else:
            value = raw
    except (KeyError, ValueError):
        raise RulesError(f"{name} cannot be {text!r}") from None
    return dataclasses.replace(RuleChoices(), **{key: value})


LEGACY_RULES = GroupRules(rounds_from=3, foreign_credit=2.0, round_foreign_credit=4.0)
"""The rules of a session created before sessions had rules: the clients' defaults of that
time, by which its members ran and which their recorded configurations hold."""
