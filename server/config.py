"""ServerConfig: every knob of `fedrl-server`, one field each.

The command line is generated from these fields (fedrl.common.config_cli), so
the help text lives here, in each field's metadata, and a test checks that
options and fields match one to one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fedrl.common.config_cli import Section, doc, section
from fedrl.common.group_rules import GroupRules, RuleChoices, RulesError, parse_choice
from fedrl.common.identity import validate_participant_id
from fedrl.server.strategy.registry import STRATEGY_NAMES, strategy_from_settings
from fedrl.server.strategy.strategy import Rule
from fedrl.server.transport.limits import LimitsConfig

_LIMITS = LimitsConfig()
_RULE = Rule()
DASHBOARD_PORT = 7444
"""The dashboard's port unless --dashboard-port says otherwise: the server's default + 1."""

SERVE = Section("serve", "Where it listens, its data, and what it tells participants.")
AGGREGATION = Section("aggregation", "How updates become global versions, and which are refused.")
CHECKPOINTS = Section("checkpoints", "Which versions' checkpoints are kept.")
TRANSPORT = Section("transport", "Message sizes and per-participant call limits.")
POPULATION = Section("population", "Population sessions (population-based training).")
SECURITY = Section("security", "How participants authenticate; plaintext off loopback.")
DASHBOARD = Section("dashboard", "The read-only web dashboard.")
RULES = Section(
    "rules",
    "The rules of a new session: what its members share and how they sync, the same for every "
    "member. The session's first participant may choose any of them (fedrl-client's options "
    "of the same names) unless --session-rule fixes it; after that they are the session's, "
    "and a member asking otherwise is refused.",
)


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one aggregation server process."""

    host: str = field(
        default="127.0.0.1",
        metadata=doc("Address to listen on; non-loopback needs TLS.", section=SERVE),
    )
    port: int = field(
        default=7443,
        metadata=doc("TCP port; 0 picks a free one (printed at start).", section=SERVE),
    )
    data_dir: Path = field(
        default=Path("fedrl-server-data"),
        metadata=doc(
            "Directory for the state database, checkpoints and logs.", path="dir", section=SERVE
        ),
    )
    goal_episodes: int = field(
        default=1000, metadata=doc("Total-episodes goal of a new session.", section=SERVE)
    )
    global_eval_interval: int = field(
        default=2_000,
        metadata=doc(
            "Each participant scores a global version it adopts at most once per this many of "
            "its own env steps, off its training path (0: every version it adopts); the best "
            "scored version is the session's best.",
            section=SERVE,
        ),
    )
    status_versions: int = field(
        default=20,
        metadata=doc("Versions listed by Status when the caller names no number.", section=SERVE),
    )
    grace_s: float = field(
        default=10.0,
        metadata=doc("On SIGTERM/SIGINT, seconds in-flight calls get to finish.", section=SERVE),
    )
    tensorboard: bool = field(
        default=False,
        metadata=doc(
            "Also write each version's figures as TensorBoard event files under "
            "<data-dir>/tensorboard/<session>/.",
            section=SERVE,
        ),
    )
    max_staleness: int = field(
        default=_RULE.max_staleness,
        metadata=doc(
            "Oldest accepted base version, in versions behind the newest; older is refused.",
            section=AGGREGATION,
        ),
    )
    buffer_size: int = field(
        default=_RULE.buffer_size,
        metadata=doc(
            "Buffered updates (K) that trigger a new global version; 0: one per participant "
            "who pushed within --active-window-s (K = N, so a lone participant's every update "
            "is a version and a group's versions average everyone's progress).",
            section=AGGREGATION,
        ),
    )
    active_window_s: float = field(
        default=_RULE.active_window_s,
        metadata=doc(
            "With --buffer-size 0, a participant counts toward K while its last push is this "
            "recent (one that crashed stops holding versions back; one that leaves stops at once).",
            section=AGGREGATION,
        ),
    )
    buffer_timeout_s: float = field(
        default=_RULE.buffer_timeout_s,
        metadata=doc(
            "A non-empty buffer becomes a version after this many seconds even below K.",
            section=AGGREGATION,
        ),
    )
    max_pending: int = field(
        default=32,
        metadata=doc(
            "Acknowledged updates not yet in a version; beyond it pushes wait (bounds memory).",
            section=AGGREGATION,
        ),
    )
    strategy: str = field(
        default="mean",
        metadata=doc(
            f"Aggregation strategy: {', '.join(STRATEGY_NAMES)} (see fedrl.server.strategy).",
            section=AGGREGATION,
        ),
    )
    trim_fraction: float = field(
        default=0.2,
        metadata=doc(
            "Share of updates cut at each end per coordinate by trimmed_mean.", section=AGGREGATION
        ),
    )
    clip_norm: float = field(
        default=_RULE.clip_norm,
        metadata=doc("Clip each update's L2 norm to this (0: no clipping).", section=AGGREGATION),
    )
    server_lr: float = field(
        default=_RULE.server_lr,
        metadata=doc(
            "Server learning rate: global += lr * velocity (the aggregate, without momentum).",
            section=AGGREGATION,
        ),
    )
    server_momentum: float = field(
        default=_RULE.server_momentum,
        metadata=doc(
            "Server momentum (FedAvgM): velocity = momentum * velocity + aggregate, in [0, 1); "
            "0: none. The velocity is kept with each version and survives a restart.",
            section=AGGREGATION,
        ),
    )
    max_samples: int = field(
        default=_RULE.max_samples,
        metadata=doc(
            "Cap on the sample count an update may claim for its weight.", section=AGGREGATION
        ),
    )
    staleness_exponent: float = field(
        default=_RULE.staleness_exponent,
        metadata=doc(
            "Staleness weight is (1 + s) ** -exponent (FedBuff's polynomial decay).",
            section=AGGREGATION,
        ),
    )
    session_strategy: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "One session's strategy as SESSION=STRATEGY, overriding --strategy; repeat.",
            section=AGGREGATION,
        ),
    )
    rules: GroupRules = field(default_factory=GroupRules, metadata=section(RULES.help))
    session_rule: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "One rule of one new session as SESSION=RULE=VALUE (e.g. pairs=rounds-from=2), "
            "overriding the rules above and fixed: its first participant cannot choose "
            "otherwise; repeat.",
            section=RULES,
        ),
    )
    max_update_norm: float = field(
        default=_RULE.max_update_norm,
        metadata=doc(
            "Refuse an update whose L2 norm exceeds this (0: no bound, trusted groups).",
            section=AGGREGATION,
        ),
    )
    update_norm_factor: float = field(
        default=_RULE.update_norm_factor,
        metadata=doc(
            "Refuse an update whose L2 norm exceeds this many times the median of the "
            "session's last 32 accepted updates' norms (before 4 are known: the global "
            "model's norm); 0: off. See fedrl.server.strategy.norm_bound.",
            section=AGGREGATION,
        ),
    )
    keep_last: int = field(
        default=5,
        metadata=doc("Checkpoints of the newest versions always retained.", section=CHECKPOINTS),
    )
    keep_every: int = field(
        default=50,
        metadata=doc("Every M-th version's checkpoint is retained as well.", section=CHECKPOINTS),
    )
    chunk_bytes: int = field(
        default=1 << 20,
        metadata=doc("Largest data field of a tensor chunk sent or accepted.", section=TRANSPORT),
    )
    max_message_bytes: int = field(
        default=8 << 20,
        metadata=doc(
            "gRPC message size limit; chunks keep every message far below it.", section=TRANSPORT
        ),
    )
    max_model_bytes: int = field(
        default=1 << 30,
        metadata=doc(
            "Largest decoded model or update a client may send (bytes).", section=TRANSPORT
        ),
    )
    max_streams_per_participant: int = field(
        default=_LIMITS.max_streams_per_participant,
        metadata=doc("Streaming calls one participant may have open at once.", section=TRANSPORT),
    )
    push_rate_per_s: float = field(
        default=_LIMITS.push_rate_per_s,
        metadata=doc(
            "Sustained pushes (updates and seeds) per second per participant.", section=TRANSPORT
        ),
    )
    push_burst: int = field(
        default=_LIMITS.push_burst,
        metadata=doc(
            "Pushes a participant may send back to back before the rate applies.", section=TRANSPORT
        ),
    )
    stream_idle_timeout_s: float = field(
        default=_LIMITS.stream_idle_timeout_s,
        metadata=doc(
            "A half-finished upload that sends nothing for this long is dropped.", section=TRANSPORT
        ),
    )
    pbt_ready_steps: int = field(
        default=20_000,
        metadata=doc(
            "Population sessions: env steps a member trains after it enrolled or last copied "
            "another before its reports rank it (PBT's 'ready'); from then on every report "
            "with a new evaluation ranks it.",
            section=POPULATION,
        ),
    )
    pbt_score_window: int = field(
        default=3,
        metadata=doc(
            "Population sessions: a member's score is the mean of its last this many "
            "evaluations since it enrolled or last copied another.",
            section=POPULATION,
        ),
    )
    pbt_replay_transitions: int = field(
        default=100_000,
        metadata=doc(
            "Population sessions: newest replay transitions a DQN member reports with its "
            "learner, which a member that copies it takes (0: none; 100,000 is the default "
            "replay's capacity: all of it).",
            section=POPULATION,
        ),
    )
    pbt_quantile: float = field(
        default=0.25,
        metadata=doc(
            "Population sessions: share of ranked members in the top and in the bottom (at "
            "least one each); a bottom member copies a top one. "
            "See fedrl.server.population.exploit_explore.",
            section=POPULATION,
        ),
    )
    pbt_resample_probability: float = field(
        default=0.25,
        metadata=doc(
            "Population sessions: chance that explore draws a hyperparameter afresh from its "
            "range instead of multiplying it by 0.8 or 1.2.",
            section=POPULATION,
        ),
    )
    token_auth: bool = field(
        default=False,
        metadata=doc(
            "Authenticate by per-participant token over one-way TLS, not client certs.",
            section=SECURITY,
        ),
    )
    insecure: bool = field(
        default=False,
        metadata=doc(
            "Allow plaintext off loopback (trusted networks only); never turns TLS off.",
            section=SECURITY,
        ),
    )
    dashboard_host: str = field(
        default="127.0.0.1",
        metadata=doc(
            "Address of the read-only web dashboard; off loopback it is served only over TLS "
            "(init-tls) and to holders of a token from `fedrl-server issue --token`.",
            section=DASHBOARD,
        ),
    )
    dashboard_port: int | None = field(
        default=None,
        metadata=doc(
            f"TCP port of the dashboard, printed at start; 0 picks a free one (default: "
            f"{DASHBOARD_PORT}, or a free one with --port 0, so that servers started side by "
            "side never collide).",
            section=DASHBOARD,
        ),
    )
    no_dashboard: bool = field(
        default=False, metadata=doc("Serve no web dashboard.", section=DASHBOARD)
    )
    dashboard_versions: int = field(
        default=1000,
        metadata=doc("Newest versions on the dashboard's learning curve.", section=DASHBOARD),
    )

    @property
    def limits(self) -> LimitsConfig:
        """The per-participant call limits, as fedrl.server.transport.limits takes them."""
        return LimitsConfig(
            max_streams_per_participant=self.max_streams_per_participant,
            push_rate_per_s=self.push_rate_per_s,
            push_burst=self.push_burst,
            stream_idle_timeout_s=self.stream_idle_timeout_s,
        )

    @property
    def rule(self) -> Rule:
        """What every session's strategy applies alike (fedrl.server.strategy.strategy)."""
        return Rule(
            max_staleness=self.max_staleness,
            max_samples=self.max_samples,
            staleness_exponent=self.staleness_exponent,
            max_update_norm=self.max_update_norm,
            update_norm_factor=self.update_norm_factor,
            clip_norm=self.clip_norm,
            server_lr=self.server_lr,
            server_momentum=self.server_momentum,
            buffer_size=self.buffer_size,
            buffer_timeout_s=self.buffer_timeout_s,
            active_window_s=self.active_window_s,
        )

    @property
    def dashboard_listen_port(self) -> int:
        """The dashboard's port: the one given, else the usual one, or any free one (0) when
        the server's own port is any free one."""
        if self.dashboard_port is not None:
            return self.dashboard_port
        return 0 if self.port == 0 else DASHBOARD_PORT

    def rules_for(self, session: str) -> tuple[GroupRules, RuleChoices]:
        """A new session's rules before its first participant chooses, and those of them the
        server fixes for it (--session-rule)."""
        fixed = _rules_by_session(self.session_rule).get(session, RuleChoices())
        return self.rules.with_choices(fixed), fixed

    def strategy_for(self, session: str) -> str:
        """The aggregation strategy of a session: its own if --session-strategy names it."""
        return _strategies_by_session(self.session_strategy).get(session, self.strategy)

    def __post_init__(self) -> None:
        """Refuse bad settings at start, with what to change, not at the first push."""
        positive = {
            "max_pending": self.max_pending,
            "chunk_bytes": self.chunk_bytes,
            "max_message_bytes": self.max_message_bytes,
            "max_model_bytes": self.max_model_bytes,
            "keep_last": self.keep_last,
            "keep_every": self.keep_every,
            "goal_episodes": self.goal_episodes,
            "status_versions": self.status_versions,
            "dashboard_versions": self.dashboard_versions,
            "pbt_ready_steps": self.pbt_ready_steps,
            "pbt_score_window": self.pbt_score_window,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.global_eval_interval < 0:
            raise ValueError(f"global_eval_interval must be >= 0, got {self.global_eval_interval}")
        for name in ("port", "dashboard_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise ValueError(f"{name} must be in 0..65535, got {value}")
        if self.max_pending < self.buffer_size:
            raise ValueError(
                f"max_pending ({self.max_pending}) must be at least buffer_size "
                f"({self.buffer_size}), or a full buffer could never form"
            )
        if self.grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {self.grace_s}")
        # The rule checks its own fields, and each named strategy its options
        # (trim_fraction, say), each naming the one that is wrong.
        rule = self.rule
        for name in {self.strategy, *_strategies_by_session(self.session_strategy).values()}:
            strategy_from_settings(name, rule, self)
        if not 0.0 < self.pbt_quantile <= 0.5:
            raise ValueError(f"pbt_quantile must lie in (0, 0.5], got {self.pbt_quantile}")
        if self.pbt_replay_transitions < 0:
            raise ValueError(
                f"pbt_replay_transitions must be >= 0, got {self.pbt_replay_transitions}"
            )
        if not 0.0 <= self.pbt_resample_probability <= 1.0:
            raise ValueError(
                f"pbt_resample_probability must lie in [0, 1], got {self.pbt_resample_probability}"
            )
        for session, fixed in _rules_by_session(self.session_rule).items():
            try:
                self.rules.with_choices(fixed)
            except RulesError as exc:
                raise ValueError(f"session_rule of session {session!r}: {exc}") from None
        # LimitsConfig checks its own fields and names the one that is wrong.
        _ = self.limits
        # A chunk plus its protobuf framing must fit one message with room to spare.
        if self.chunk_bytes + (64 << 10) > self.max_message_bytes:
            raise ValueError(
                f"chunk_bytes ({self.chunk_bytes}) must be at least 64 KiB below "
                f"max_message_bytes ({self.max_message_bytes})"
            )


def _strategies_by_session(entries: tuple[str, ...]) -> dict[str, str]:
    """SESSION=STRATEGY entries as a mapping; ValueError naming the entry that is wrong."""
    mapping: dict[str, str] = {}
    for entry in entries:
        # rpartition: a session name may itself contain "=", a strategy name never does.
        name, equals, strategy = entry.rpartition("=")
        if not equals or strategy not in STRATEGY_NAMES:
            raise ValueError(
                f"session_strategy entry {entry!r} must be SESSION=STRATEGY with a strategy "
                f"among {', '.join(STRATEGY_NAMES)}"
            )
        session = _session_name(name, entry, "session_strategy")
        if session in mapping:
            raise ValueError(f"session_strategy names session {session!r} twice")
        mapping[session] = strategy
    return mapping


def _rules_by_session(entries: tuple[str, ...]) -> dict[str, RuleChoices]:
    """SESSION=RULE=VALUE entries as each session's fixed choices; ValueError naming the entry
    that is wrong."""
    mapping: dict[str, RuleChoices] = {}
    for entry in entries:
        # A session name may itself contain "=", a rule's name and value never do.
        name, equals, rule = entry.rpartition("=")
        name, equals_too, key = name.rpartition("=")
        if not (equals and equals_too):
            raise ValueError(
                f"session_rule entry {entry!r} must be SESSION=RULE=VALUE, e.g. pairs=rounds-from=2"
            )
        session = _session_name(name, entry, "session_rule")
        try:
            choice = parse_choice(key, rule)
        except RulesError as exc:
            raise ValueError(f"session_rule entry {entry!r}: {exc}") from None
        chosen = mapping.get(session, RuleChoices())
        if set(chosen.chosen()) & set(choice.chosen()):
            raise ValueError(f"session_rule names rule {key!r} of session {session!r} twice")
        mapping[session] = choice.over(chosen)
    return mapping


def _session_name(name: str, entry: str, option: str) -> str:
    """`name` as a session name; ValueError naming `option`'s `entry` when it is not one."""
    try:
        return validate_participant_id(name)
    except ValueError as exc:
        message = str(exc).replace("participant id", "session name")
        raise ValueError(f"{option} entry {entry!r}: {message}") from None
