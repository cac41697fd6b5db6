"""The sync loop: a participant's training engine federated with a fedrl server.

The engine's poll loop runs in the main thread and calls
`SyncLoop.after_poll` after every round; the network traffic runs on the
server link's thread (fedrl.client.federation.server_link).

How it syncs and what it shares are the session's rules
(fedrl.common.group_rules), the same for every member: the participant
sends the ones it chose explicitly with its Join (a new session takes them,
an existing one refuses them where its own differ) and follows what the
join reply says. Its plan (fedrl.client.federation.sync_plan) and the credit
of others' experience follow from them. A participant that starts while the
server is away trains by its choices over the rules' defaults until its
first join, and then by the session's (a session that shares otherwise
stops it with a message: its parts are built for one share).

What the participant shares with the session is the rules' `share`:

- "weights": its progress as weight deltas, averaged into global versions
  that it adopts back (fedrl.client.federation.weight_sync);
- "experience": its transitions out, and other participants' into its
  replay (fedrl.client.federation.experience_sync). It keeps training its
  own model: it never pushes a delta and never adopts a global model. It
  joins (the server checks its model spec there, as for everyone) but does
  not seed an empty session, since it contributes nothing to a global model.
  Its episodes are not counted toward the session goal: the protocol
  reports episodes with updates, and it sends none;
- "both" (the default): both, each on its own task of the network thread.

A two-player game's participant also pulls the session's kept versions into
its league of opponents and reports its ratings, whatever it shares
(fedrl.client.federation.league_sync).

Experience is off-policy data: a PPO participant shares weights only.

Every `sync_interval` local episodes, or `sync_steps` env steps if that
comes first (fedrl.client.federation.sync_interval), the weight half
pushes and the experience half queues a batch, each on its own clock. The
run stops when the session goal is reached (the server says so, or its
count plus this participant's unpushed episodes reach it): the current
round finishes, `finish` pushes and queues what is left and flushes the
outbox (bounded wait), and the caller saves.

Synchronous rounds (`--round-wait-s`; with `--rounds-from`, only while
that many members push weights: fedrl.client.federation.sync_plan).
Asynchronously a member adopts a version at its next sync after the
version formed, so its model meets the others' only every few syncs, and
late; rounds average every member's model every round, as the lock-step
simulation (bench/federation_sim.py) does with nothing late. In rounds,
every member syncs every `sync_steps` env steps and episodes do not
trigger syncs, so all push at the same steps; after queueing its
experience and seeing it acknowledged, a member pushes its update and
waits, bounded by `round_wait_s`, for the version that holds it (with the
server's automatic K: one update from every active member), adopts it,
then pulls the experience the others flushed before their pushes. Every
member then starts each round from the same average with the whole
round's data, as in the simulation. Each round waits for the slowest
member; one that left stops counting at once (the server drops it from K
on leave), one that crashed after the server's buffer timeout, and
nothing waits while the server is unreachable. A member moves between
rounds and asynchronous syncs as the count of pushing members the server
last sent it (those whose updates it heard within its active window)
crosses the plan's threshold, and syncs in rounds until its learner
starts whatever the group's size (the plan's warmup), so that the group's
experience fills every member's replay together.

Exploration needs no global schedule: actors use fixed Ape-X rates
(fedrl.client.training.exploration), not a decay from ε = 1, so a
participant who joins a session late explores like everyone else from its
first step.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import grpc

from fedrl.client.federation.backoff import BackoffPolicy
from fedrl.client.federation.errors import SyncError, UnavailableError
from fedrl.client.federation.experience_cursor import CursorFile
from fedrl.client.federation.experience_sync import ExchangeConfig, ExperienceSync
from fedrl.client.federation.federation_client import DataLabel
from fedrl.client.federation.global_scoring import VersionScore
from fedrl.client.federation.league_sync import LeagueSync
from fedrl.client.federation.observation_bounds import ObservationBounds
from fedrl.client.federation.outbox import Outbox, OutboxLimits
from fedrl.client.federation.server_link import ServerLink, ServerView
from fedrl.client.federation.sync_plan import SyncPlan, effective_share, sync_plan
from fedrl.client.federation.sync_state import STATE_FILE
from fedrl.client.federation.weight_sync import WeightSync
from fedrl.client.training.counters import PollResult
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import TargetAtAdoption
from fedrl.common.errors import DecodeError
from fedrl.common.group_rules import SHARES, GroupRules, RuleChoices, Share, in_one_line
from fedrl.common.group_rules_serde import choices_to_proto, rules_from_proto
from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb

log = logging.getLogger(__name__)

SyncModeName = Literal["warmup", "rounds", "async"]
EXPERIENCE_CURSOR_FILE = "experience_cursor.json"

_DEFAULT_OUTBOX_LIMITS = OutboxLimits()
_DEFAULT_EXCHANGE = ExchangeConfig()
_DEFAULT_BACKOFF = BackoffPolicy()
_NO_CHOICES = RuleChoices()


def shares_experience(share: Share) -> bool:
    """Whether a participant with this share exchanges experience; ValueError for no share."""
    if share not in SHARES:
        raise ValueError(f"share must be one of {', '.join(SHARES)}, got {share!r}")
    return share != "weights"


class SyncLoop:
    """Shares the engine's weights, experience or both with a session; says when its goal is met."""

    def __init__(
        self,
        engine: TrainingEngine,
        *,
        state_dir: Path,
        participant_id: str,
        session: str,
        spec: tpb.ModelSpec,
        channel_factory: Callable[[], grpc.aio.Channel],
        rules: RuleChoices = _NO_CHOICES,
        evaluate_global: bool = True,
        outbox_limits: OutboxLimits = _DEFAULT_OUTBOX_LIMITS,
        backoff: BackoffPolicy = _DEFAULT_BACKOFF,
        exchange: ExchangeConfig = _DEFAULT_EXCHANGE,
        target_at_adoption: TargetAtAdoption = "shift",
        on_record: Callable[[dict[str, Any]], None] | None = None,
        data: DataLabel | None = None,
    ) -> None:
        """`rules`: the session's rules this participant chose explicitly. Everything else
        of how it syncs and what it shares comes from the session's rules, which the join
        brings (module docstring); a session whose rules differ from a choice refuses it.
        ValueError at once for choices this engine cannot follow.
        `exchange` says how much experience one sync trades when the session shares it (a
        DQN engine: other participants' transitions go into its replay,
        TrainingEngine.add_foreign). `target_at_adoption` is what the learner's target
        network does when a global model is adopted (Learner.set_weights).
        `on_record` receives one metrics record per push ("sync") and adoption ("adopt").
        `data` says what this participant trains on, for the server's status."""
        self._data = data
        self._engine = engine
        self._dir = state_dir
        self._participant_id = participant_id
        self._session = session
        self._spec = spec
        self._channel_factory = channel_factory
        self._link: ServerLink | None = None
        self._choices = rules
        self._rules = GroupRules().with_choices(rules)
        self._plan = self._plan_for(self._rules)
        self._warming_up = False
        self._mode = self._plan.alone
        self._start_mode()
        self._rules_heard: pb.SessionConfig | None = None
        self._evaluate_global = evaluate_global
        self._exchange = exchange
        self._target_at_adoption: TargetAtAdoption = target_at_adoption
        self._on_record = on_record
        self._outbox_limits = outbox_limits
        self._backoff = backoff
        self._late_rounds = 0
        self._weights: WeightSync | None = None
        self._experience: ExperienceSync | None = None
        self._build_parts()
        self._outbox: Outbox | None = None
        self._league: LeagueSync | None = None
        self._experience_queued_at = 0
        self._experience_queued_steps = 0
        self._experience_queued_time = -math.inf

    def _plan_for(self, rules: GroupRules) -> SyncPlan:
        """How this participant syncs under `rules`; ValueError where it cannot follow them."""
        plan = sync_plan(rules, on_policy=self._engine.on_policy)
        if self._engine.on_policy and rules.share == "experience":
            raise ValueError(
                "experience exchange is off-policy data, which PPO does not learn from: a PPO "
                "participant shares weights (--share weights or both)"
            )
        if not self._engine.learns and self._share_under(rules) != "both":
            raise ValueError(
                "a participant that only acts (--role actor) plays the global model and pushes "
                "its experience for the session's learners: it needs --share both"
            )
        return plan

    def _share_under(self, rules: GroupRules) -> Share:
        return effective_share(rules.share, on_policy=self._engine.on_policy)

    def _start_mode(self) -> None:
        """The plan's mode for now: its warmup until the learner starts, if it has one."""
        engine = self._engine
        self._warming_up = (
            self._plan.warmup is not None
            and engine.learns
            and not engine.on_policy
            and not engine.learning_started
        )
        pushing = self._link.view.pushing_participants if self._link is not None else 0
        self._mode = self._plan.mode(pushing, learning=not self._warming_up)

    def _build_parts(self) -> None:
        """The weight and experience halves for the share of the rules followed (they touch
        nothing until start attaches them)."""
        engine, spec, state_dir = self._engine, self._spec, self._dir
        share = self._share_under(self._rules)
        self._weights = self._experience = None
        if share != "experience":
            self._weights = WeightSync(
                engine,
                state_path=state_dir / STATE_FILE,
                participant_id=self._participant_id,
                session=self._session,
                spec_hash=spec_hash(spec),
                sync_interval=self._mode.interval,
                delta_dtype=self._mode.delta_dtype,
                evaluate_global=self._evaluate_global,
                target_at_adoption=self._target_at_adoption,
                on_record=self._on_record,
            )
        if shares_experience(share):
            # An on-policy engine shares weights only (_plan_for); this one replays.
            assert isinstance(engine.learner, Learner)
            self._experience = ExperienceSync(
                self._exchange,
                rules=self._rules,
                obs_shape=engine.obs_shape,
                n_step=engine.config.n_step,
                gamma=engine.learner.config.gamma,
                spec_hash=spec_hash(spec),
                session=self._session,
                participant_id=self._participant_id,
                cursor=CursorFile(state_dir / EXPERIENCE_CURSOR_FILE),
                pull=engine.learns,
                bounds=ObservationBounds.of(spec.observation_space),
                opponent_name=(
                    None if engine.self_play is None else engine.self_play.league.name_of
                ),
            )

    def _follow(self, config: pb.SessionConfig) -> None:
        """Follow the session's rules from its join reply (a server older than the rules sends
        none: this participant's own then stand); SyncError where it cannot."""
        self._rules_heard = config
        if not config.HasField("rules"):
            return
        try:
            rules = rules_from_proto(config.rules)
        except DecodeError as exc:
            raise SyncError(f"session {self._session!r}: {exc}") from None
        if rules == self._rules:
            return
        try:
            plan = self._plan_for(rules)
        except ValueError as exc:
            raise SyncError(
                f"session {self._session!r} runs by rules this participant cannot follow "
                f"({in_one_line(rules)}): {exc}"
            ) from None
        new_share = self._share_under(rules) != self._share_under(self._rules)
        if new_share and self._outbox is not None:
            raise SyncError(
                f"session {self._session!r} has --share {rules.share}; this participant "
                f"started before it could join and shares {self._rules.share}, the default. "
                "Its work is saved: run it again to follow the session's rules from the start"
            )
        if self._outbox is not None:
            log.warning(
                "joined session %r: following its rules from now on: %s",
                self._session,
                in_one_line(rules),
            )
        self._rules, self._plan = rules, plan
        self._start_mode()
        if new_share:
            self._build_parts()
        if self._weights is not None:
            self._weights.set_mode(self._mode.interval, self._mode.delta_dtype)
        if self._experience is not None:
            self._experience.follow(rules)

    @property
    def state_path(self) -> Path:
        return self._dir / STATE_FILE

    # Start.

    def start(self, *, connect_timeout_s: float = 20.0) -> pb.JoinReply | None:
        """Join the session, take its rules and restore the sync state; None when the server
        is unreachable.

        SyncError when the session refuses this model or this participant's choice of its
        rules, or has rules it cannot follow, before anything local is written, so a wrong
        model, rule or session leaves the state dir as it was.
        """
        self._link = link = ServerLink(
            channel_factory=self._channel_factory,
            participant_id=self._participant_id,
            session=self._session,
            spec=self._spec,
            backoff=self._backoff,
            rules=choices_to_proto(self._choices),
            data=self._data,
        )
        try:
            link.start()
            reply: pb.JoinReply | None = None
            try:
                reply = link.probe(connect_timeout_s)
            except (UnavailableError, TimeoutError) as exc:
                log.warning(
                    "server unreachable at start (%s); training offline until then, by the "
                    "rules' defaults and this participant's choices",
                    exc,
                )
            if reply is not None:
                self._follow(reply.config)
            self._outbox = Outbox(self._dir / "outbox", limits=self._outbox_limits)
            if self._weights is not None:
                self._weights.attach(link, self._outbox)
            if self._experience is not None:
                self._experience.attach(link, self._outbox)
                self._engine.on_batch(self._experience.record)
            if self._engine.self_play is not None:
                self._league = LeagueSync(self._engine.self_play, link)
            self._experience_queued_at = self._engine.counters.episodes
            self._experience_queued_steps = self._engine.counters.env_steps
            if reply is not None:
                try:
                    reply = link.connect()
                except UnavailableError as exc:
                    log.warning("server lost while joining (%s); retrying in the background", exc)
                    reply = None
            link.run_in_background()
        except BaseException:
            self.close()
            raise
        return reply

    # Every round.

    def after_poll(self, result: PollResult) -> None:
        """Record the round; push and queue when their intervals are full; adopt what arrived."""
        link = self._require_link()
        fatal = link.fatal
        if fatal is not None:
            raise SyncError(f"federation stopped: {fatal}")
        if link.view.session is not self._rules_heard:
            # A join since the last round (the first, for a participant that started while
            # the server was away): the session's rules come with it.
            self._follow(link.view.session)
        if self._league is not None:
            self._league.after_poll()
        self._choose_mode()
        if self._mode.rounds and self._weights is not None:
            self._synchronous_round(result)
            return
        if self._weights is not None:
            self._weights.after_poll(result)
        if self._experience is not None:
            self._experience.adopt(self._engine)
        # Its own clock: before the first adoption the weight half pushes
        # nothing, but experience still goes out. One batch in flight at a
        # time, as for updates: while one waits (the server's rate limit, a
        # slow link), new transitions gather into the next, larger batch
        # instead of a queue the outbox would have to drop from.
        counters = self._engine.counters
        if (
            self._experience is not None
            and self._mode.interval.due(
                episodes=counters.episodes - self._experience_queued_at,
                env_steps=counters.env_steps - self._experience_queued_steps,
                total_env_steps=counters.env_steps,
            )
            and time.monotonic() - self._experience_queued_time >= self.view.push_spacing_s
            and not self._experience.in_flight()
        ):
            self.queue_experience()

    def _choose_mode(self) -> None:
        """Leave the warmup rounds once the learner starts; then switch between rounds and
        asynchronous syncs as the group crosses the plan's threshold, each member deciding
        from the count of pushing members the server last sent it
        (fedrl.client.federation.sync_plan)."""
        if self._warming_up:
            if not self._engine.learning_started:
                return
            self._warming_up = False
        elif not self._plan.follows_the_group:
            return
        pushing = self.view.pushing_participants
        mode = self._plan.mode(pushing)
        if mode == self._mode:
            return
        self._mode = mode
        if self._weights is not None:
            self._weights.set_mode(mode.interval, mode.delta_dtype)
        interval = mode.interval
        log.info(
            "%d members pushing: syncing %s",
            pushing,
            f"in rounds of {interval.env_steps} env steps"
            if mode.rounds
            else f"asynchronously, every {interval.episodes} episodes"
            + (f" or {interval.env_steps} env steps" if interval.env_steps else ""),
        )

    def _synchronous_round(self, result: PollResult) -> None:
        """Experience out, update out, the round's version and experience in (module docstring)."""
        weights, experience = self._weights, self._experience
        assert weights is not None
        weights.observe(result)
        if experience is not None:
            experience.adopt(self._engine, in_rounds=True)
        if not weights.due(result):
            return
        # The server's push rate limit sets the shortest round: wait it out
        # rather than skip a push, which would leave the others waiting.
        time.sleep(weights.pace_left_s())
        connected = self.view.connected
        deadline = time.monotonic() + self._mode.round_wait_s

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        if experience is not None:
            self.queue_experience()
            if connected:
                experience.flush(left())
        # Rounds count from the first adoption (a push needs a base version): a member that
        # trained on without one would leave the others' rounds behind.
        if connected and not weights.await_first_version(left()):
            return
        sequence = weights.push_when_sent(left() if connected else 0.0)
        if sequence is None or not connected:
            return
        in_time = weights.await_version(sequence, left())
        if experience is not None:
            experience.adopt(self._engine, in_rounds=True)
            in_time = experience.pull_fresh(left()) and in_time
            experience.adopt(self._engine, in_rounds=True)
        if not in_time:
            self._late_rounds += 1
            # Said at the first and then each time the count doubles: a member
            # that crashed holds rounds up for the server's buffer timeout.
            if self._late_rounds & (self._late_rounds - 1) == 0:
                log.warning(
                    "%d synchronous rounds so far ended without the round's version within "
                    "%.1f s (a slow or lost member, or the server); training went on",
                    self._late_rounds,
                    self._mode.round_wait_s,
                )

    def push(self) -> int | None:
        """Write the weight progress since the last push to the outbox; its sequence, or None."""
        return self._weights.push() if self._weights is not None else None

    def queue_experience(self) -> int | None:
        """Queue a sample of recent transitions for the session; its sequence, or None if none.

        Independent of push(): experience needs no base version, so it flows
        before the first adoption too.
        """
        if self._experience is None or self._outbox is None:
            return None
        link = self._require_link()
        self._experience_queued_at = self._engine.counters.episodes
        self._experience_queued_steps = self._engine.counters.env_steps
        self._experience_queued_time = time.monotonic()
        entry = self._experience.queue(self._outbox, chunk_bytes=link.chunk_bytes)
        if entry is None:
            return None
        self._experience.send_soon()
        return entry.sequence

    # Progress and stop.

    @property
    def view(self) -> ServerView:
        return self._require_link().view

    @property
    def rules(self) -> GroupRules:
        """The session's rules this participant follows (before its first join: its own
        choices over the rules' defaults)."""
        return self._rules

    @property
    def plan(self) -> SyncPlan:
        """How it syncs under those rules (fedrl.client.federation.sync_plan)."""
        return self._plan

    @property
    def base_version(self) -> int:
        return self._weights.base_version if self._weights is not None else -1

    @property
    def in_rounds(self) -> bool:
        """Whether it syncs in synchronous rounds now (the plan's mode for the session's size)."""
        return self._mode.rounds

    @property
    def sync_mode(self) -> SyncModeName:
        """How it syncs now, for the progress line: "warmup" (rounds until the learner
        starts), "rounds" or "async"."""
        if self._warming_up:
            return "warmup"
        return "rounds" if self._mode.rounds else "async"

    @property
    def late_rounds(self) -> int:
        """Synchronous rounds that went on without their version or experience in time."""
        return self._late_rounds

    @property
    def goal_reached(self) -> bool:
        """The server says so, or its count plus this participant's unpushed episodes reach it.

        The second half saves a sync interval of overshoot: the final push in
        finish() then takes the session over the goal. A participant sharing
        experience only pushes no episodes, so only the server's word counts.
        """
        goal = self.view.goal
        if goal is None:
            return False
        if self._weights is None:
            return goal.reached
        unpushed = self._weights.unpushed_episodes
        return goal.reached or goal.episodes_done + unpushed >= goal.total_episodes > 0

    @property
    def global_score(self) -> VersionScore | None:
        """The last global version scored here and its greedy return, if any."""
        return self._weights.global_score if self._weights is not None else None

    def raise_goal(self, total_episodes: int) -> pb.GoalState:
        return self._require_link().raise_goal(total_episodes)

    def status(self) -> pb.StatusReply:
        return self._require_link().status()

    def finish(self, *, flush_timeout_s: float = 60.0, leave: bool = True) -> int:
        """Push what is left, wait for the acknowledgements, leave; returns updates still unsent."""
        link = self._require_link()
        deadline = time.monotonic() + flush_timeout_s
        self.queue_experience()
        left = self._weights.finish(deadline=deadline) if self._weights is not None else 0
        if self._experience is not None and not self._experience.flush(
            max(0.0, deadline - time.monotonic())
        ):
            log.warning("experience batches stay in the outbox and will be sent by the next run")
        if self._league is not None and self.view.connected:
            self._league.report()
            if not self._league.flush(max(0.0, deadline - time.monotonic())):
                log.warning("the last ratings did not reach the server; the next run sends them")
        if leave and self.view.connected:
            link.leave("finished")
        return left

    def close(self) -> None:
        if self._weights is not None:
            self._weights.close()
        if self._link is not None:
            self._link.close()
            self._link = None

    def _require_link(self) -> ServerLink:
        if self._link is None:
            raise RuntimeError("sync loop not started: call start() first")
        return self._link
