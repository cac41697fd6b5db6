"""The participant's training engine: actors collect, the learner trains, evaluation keeps score.

One `TrainingEngine` drives everything below the command line and the sync
loop. `poll()` does one round and returns what happened, so a caller can
interleave its own work (autosave, federated sync) between rounds; `run()`
polls until a stop condition.

The algorithm is chosen by the learner's config, and with it one of two
schedules over the same actor pool, shared memory and serial mode:
off-policy (DQN, `LearnerConfig`: fedrl.client.training.replay_schedule) or
on-policy (PPO, `PPOConfig`: fedrl.client.training.rollout_schedule). The
engine around them keeps the counts, evaluates, takes part in the learner
ranks' exchange (fedrl.client.training.distributed), changes
hyperparameters and copies whole learners (population-based training), and
adopts models (federation). For a two-player game it also runs self-play
(fedrl.client.training.self_play): the league of opponents its actors draw
from, and their ratings.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import torch

from fedrl.client.training.counters import Counters, PollResult, Tally
from fedrl.client.training.distributed import RankGroup, RoundLedger, RoundOutcome, outcome_of
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.evaluation import (
    EvalResult,
    Evaluator,
    PolicyEvaluator,
    Scorer,
    greedy_policy,
)
from fedrl.client.training.frame_slots import SlotLayout
from fedrl.client.training.game_evaluation import GameEvaluator
from fedrl.client.training.hyperparameters import (
    Hyperparameters,
    actors_need_restart,
    read_hyperparameters,
    with_hyperparameters,
)
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig, TargetAtAdoption
from fedrl.client.training.learner_copy import export_learner, import_learner
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.ppo_learner import PPOConfig, PPOLearner
from fedrl.client.training.q_network import DEFAULT_NETWORK, load_named_arrays
from fedrl.client.training.replay_schedule import ReplaySchedule
from fedrl.client.training.rollout_schedule import RolloutSchedule
from fedrl.client.training.self_play import SelfPlay
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.client.training.vector_env import env_shape, make_vector_env
from fedrl.common.closing import Closing
from fedrl.envs.atari import is_atari
from fedrl.envs.board_games import game_rules, is_two_player


class TrainingEngine(Closing):
    """Actors, learner and evaluation, in one process (workers=0) or across processes."""

    def __init__(
        self,
        config: EngineConfig,
        learner_config: LearnerConfig | PPOConfig,
        *,
        network: NetworkConfig = DEFAULT_NETWORK,
        recent_window: int = 100,
        learn: bool = True,
        ranks: RankGroup | None = None,
    ) -> None:
        """A PPOConfig trains PPO, a LearnerConfig DQN; `network` picks the torso of either.

        `learn=False` (DQN only) makes an engine that only acts: its actors play
        whatever model it is given and its batches go to the on_batch hooks,
        but nothing is stored or trained (a participant in the actor role).
        `ranks` makes this engine one learner rank of several
        (fedrl.client.training.distributed): every poll then starts with the
        ranks' exchange, counters are the sum over the ranks, and only rank 0
        evaluates.
        """
        self.config = config
        self._ranks = ranks
        self._all_ready = False
        self._stop_requested = False
        self._stopping = False
        # Rank 0 shares its learner's whole state at start, and again after
        # anything but training changed it (resume, adoption, hyperparameters).
        self._state_changed = True
        self._seeds = np.random.SeedSequence(config.seed)
        actor_seeds, eval_seed, learner_seed = self._seeds.spawn(3)
        self._network = network
        on_policy = isinstance(learner_config, PPOConfig)
        probe = make_vector_env(config.env, 1, config.data, window=network.window)
        try:
            shape = env_shape(probe, continuous=on_policy)
        finally:
            probe.close()
        self.env_shape = shape
        self.obs_shape, self.n_actions = shape.obs_shape, shape.n_actions
        if not learn and on_policy:
            raise ValueError("PPO learns from its own rollouts: it has no acting-only role")
        if not learn and ranks is not None:
            raise ValueError(
                "an engine that only acts trains nothing, so it has no learner ranks to run: "
                "use one learner, or the learner role"
            )
        two_player = is_two_player(config.env)
        if two_player and ranks is not None:
            raise ValueError(
                f"{config.env}: two-player games train with one learner rank (their league "
                "and its ratings live in one process): drop --learners"
            )
        self.learns = learn
        # Counted here until the next exchange reports them to every rank.
        self._tally = Tally(
            recent_window=recent_window, ledger=RoundLedger() if ranks is not None else None
        )
        self.learner: Learner | PPOLearner
        self._schedule: ReplaySchedule | RolloutSchedule
        seed = _seed_of(learner_seed)
        self.self_play = SelfPlay(config.self_play, seed=seed) if two_player else None
        """Two-player games: the league of opponents and their ratings; None for other envs."""
        if isinstance(learner_config, PPOConfig):
            self.learner = PPOLearner(
                obs_shape=self.obs_shape,
                shape=shape,
                config=replace(learner_config, seed=seed),
                network=network,
                gradients=ranks,
            )
            self._schedule = RolloutSchedule(
                self.learner,
                config=config,
                network=network,
                seed_root=actor_seeds,
                tally=self._tally,
            )
        else:
            self.learner = Learner(
                obs_shape=self.obs_shape,
                n_actions=self.n_actions,
                config=replace(learner_config, seed=seed),
                network=network,
                gradients=ranks,
                action_mask=shape.action_mask,
                symmetries=game_rules(config.env).symmetries if two_player else None,
            )
            self._schedule = ReplaySchedule(
                self.learner,
                config=config,
                network=network,
                seed_root=actor_seeds,
                tally=self._tally,
                # DQN on Atari's frame stacks: actors hand over single frames, the
                # replay keeps each once. (Other image envs send whole observations,
                # whose frames the replay still stores once where consecutive rows
                # share them.)
                frames=is_atari(config.env),
                learns=learn,
                world_size=1 if ranks is None else ranks.world_size,
            )
        self._evaluator = (
            self._make_evaluator(config.eval_episodes, eval_seed)
            if config.eval_interval and (ranks is None or ranks.leads)
            else None
        )
        self._best_eval: float | None = None
        self._last_eval: float | None = None
        self._next_eval = config.eval_interval
        self._started = False

    @property
    def on_policy(self) -> bool:
        """PPO (rollouts, one update each) rather than DQN (replay)."""
        return isinstance(self._schedule, RolloutSchedule)

    @property
    def frames(self) -> bool:
        """DQN on Atari's frame stacks: the actors hand over single frames."""
        return isinstance(self._schedule, ReplaySchedule) and self._schedule.frames

    @property
    def learning_started(self) -> bool:
        """DQN: whether the learner has begun updating, its replay (foreign transitions
        included) having reached learning_starts on every rank. False for PPO and for an
        engine that only acts."""
        return isinstance(self._schedule, ReplaySchedule) and self._schedule.learning_started

    @property
    def replay_size(self) -> int | None:
        """Transitions in the DQN learner's replay; None for PPO, which keeps none."""
        return len(self.learner.replay) if isinstance(self.learner, Learner) else None

    @property
    def foreign_received(self) -> int:
        """Other participants' transitions taken in (add_foreign), this run."""
        return self._schedule.foreign_received if isinstance(self._schedule, ReplaySchedule) else 0

    def ring_layout(self, workers: int) -> SlotLayout:
        """The shared-memory slots `workers` actor processes fill (what start() allocates)."""
        return self._schedule.ring_layout(workers)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        """Starts collection with the learner's current weights."""
        if self._started:
            raise RuntimeError("engine already started")
        self._started = True
        # A last resort for callers that forget close(): actors and segments go at exit.
        atexit.register(self.close)
        torch.set_num_threads(self.config.learner_threads)
        if self._ranks is not None:
            self._share_state()
        try:
            if self.self_play is not None:
                self._schedule.opponents = self.self_play.start(self.learner.weights())
            self._schedule.start(self.config.workers)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stops actors and frees every shared-memory segment; safe to call twice."""
        atexit.unregister(self.close)
        self._schedule.pool.close()
        if self.self_play is not None:
            self.self_play.close()
        if self._evaluator is not None:
            self._evaluator.close()
            self._evaluator = None

    def __enter__(self) -> Self:
        self.start()
        return self

    # -- the loop ------------------------------------------------------------

    def poll(self, *, timeout_s: float = 0.05) -> PollResult:
        """One round: take in experience, train what is due, publish, evaluate."""
        if not self._started:
            raise RuntimeError("call start() (or use the engine as a context manager) first")
        steps_before, updates_before = self._tally.env_steps, self.learner.updates
        rounds_before = self.learner.rounds if isinstance(self.learner, PPOLearner) else 0
        # The ranks' counts join this rank's only once the round is done: a
        # round cut short by a dead rank leaves counters and metrics agreeing.
        counted = self._exchange() if self._ranks is not None else None
        metrics: dict[str, float] = {}
        if not self._stopping:
            ranks_ready = self._all_ready if self._ranks is not None else None
            metrics = self._schedule.poll(timeout_s, ranks_ready=ranks_ready)
        self._schedule.check_actors()
        if counted is not None:
            self._tally.settle(counted)
        if self.self_play is not None:
            opponents, outcomes = self._tally.take_games()
            self.self_play.after_poll(
                opponents, outcomes, updates=self.learner.updates, weights=self.learner.weights
            )
        evaluation, new_best = self._maybe_evaluate()
        returns, lengths = self._tally.take_finished()
        rounds = self.learner.rounds - rounds_before if isinstance(self.learner, PPOLearner) else 0
        return PollResult(
            episode_returns=returns,
            episode_lengths=lengths,
            env_steps=self._tally.env_steps - steps_before,
            updates=self.learner.updates - updates_before,
            train_metrics=metrics,
            evaluation=evaluation,
            new_best=new_best,
            policy_updates=rounds,
            rating=None if self.self_play is None else self.self_play.league.learner.rating,
        )

    def run(
        self,
        until: Callable[[Counters], bool],
        *,
        on_poll: Callable[[PollResult], None] | None = None,
    ) -> Counters:
        """Polls until `until(counters)` holds; `on_poll` sees every round (autosave, logging).

        As one rank of several it polls until the ranks agree to stop: when
        `until` holds here or any rank asked to (request_stop).
        """
        while True:
            if until(self.counters):
                if self._ranks is None:
                    break
                self.request_stop()
            if self._stopping:
                break
            result = self.poll()
            if on_poll is not None:
                on_poll(result)
        return self.counters

    def on_batch(self, hook: Callable[[LearnerTransitions], None]) -> None:
        """Call `hook` with every local batch the learner takes in, after it was validated.

        DQN only: PPO's rollouts are no batches of transitions.
        """
        if not isinstance(self._schedule, ReplaySchedule):
            raise TypeError("only DQN takes in batches of transitions; PPO learns from rollouts")
        self._schedule.on_batch(hook)

    def add_foreign(self, batch: LearnerTransitions, *, credit: float = 1.0) -> None:
        """Other participants' transitions, into the learner's one replay beside local ones.

        Each earns `credit` times a local env step's replay-ratio credit:
        with 1, every transition in the replay gets the same expected number
        of replays whoever collected it, and the updates grow with all the
        data received (Ape-X's learner, across a federation). Checked like a
        local batch; DQN only (PPO learns from its own rollouts). As one rank
        of several, the transitions stay in this rank's shard and the credit
        joins the other ranks' at the next exchange.
        """
        if not isinstance(self._schedule, ReplaySchedule):
            raise TypeError("foreign transitions are off-policy data: only DQN learns from them")
        self._schedule.add_foreign(batch, credit=credit)

    # -- learner ranks -------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """A stop was requested; as one rank of several, every rank has agreed to it."""
        return self._stopping

    def request_stop(self) -> None:
        """Stop at the next round (for a rank: every rank stops after the next exchange).

        Safe from a signal handler: it only sets a flag.
        """
        self._stop_requested = True
        if self._ranks is None:
            self._stopping = True

    def _exchange(self) -> RoundOutcome:
        """One round among the ranks: counts, readiness, stop requests, rank 0's new state.

        Returns the round, whose counts the caller adds once the poll is through.
        """
        assert self._ranks is not None and self._tally.ledger is not None
        row = self._tally.ledger.row(
            ready=self._schedule.ready(), stop=self._stop_requested, changed=self._state_changed
        )
        outcome = outcome_of(self._ranks.exchange(row))
        self._all_ready = outcome.all_ready
        self._stopping = self._stopping or outcome.stop
        if outcome.state_changed:
            self._share_state()
        return outcome

    def _share_state(self) -> None:
        """Rank 0's learner, counters and hyperparameters on every rank (a collective)."""
        assert self._ranks is not None
        leads = self._ranks.leads
        state = self._ranks.broadcast_state(
            {
                "learner": self.learner.state_dict(),
                "counters": dataclasses.asdict(self.counters),
                "hyperparameters": dict(self.hyperparameters()),
            }
            if leads
            else None
        )
        if not leads:
            updates = self.learner.updates
            self.learner.load_state_dict(state["learner"])
            if self.learner.updates != updates and isinstance(self._schedule, ReplaySchedule):
                # Rank 0 took another learner's state (copy_learner) and restarted its credit.
                self._schedule.restart_credit()
            counters = dict(state["counters"])
            counters["recent_returns"] = tuple(counters["recent_returns"])
            self.restore_counters(Counters(**counters))
            self.set_hyperparameters(state["hyperparameters"])
        self._state_changed = False
        if self._started and self._schedule.pool.started:
            self._schedule.publish()

    # -- hyperparameters (population-based training) ------------------------

    def hyperparameters(self) -> Hyperparameters:
        """The values population-based training may change, by their wire names."""
        return read_hyperparameters(self.config, self.learner.config)

    def set_hyperparameters(self, values: Hyperparameters) -> None:
        """Take new hyperparameters; actors restart where theirs changed (DQN: ε, n-step γ).

        Transitions already in the replay keep the discount they were
        collected with; the replay turns over within replay_capacity steps.
        """
        engine_config, learner_config = with_hyperparameters(
            self.config, self.learner.config, values
        )
        restart = self._started and actors_need_restart(
            self.config, self.learner.config, engine_config, learner_config
        )
        if isinstance(self.learner, PPOLearner):
            assert isinstance(learner_config, PPOConfig)
            self.learner.reconfigure(learner_config)
        else:
            assert isinstance(learner_config, LearnerConfig)
            self.learner.reconfigure(learner_config)
        self.config = engine_config
        self._schedule.set_config(engine_config)
        self._state_changed = True
        if restart:
            self._schedule.restart_actors()

    # -- a whole learner (population-based training's exploit) ----------------

    def learner_state(
        self, *, replay_transitions: int, max_replay_bytes: int
    ) -> list[tuple[str, npt.NDArray[Any]]]:
        """The learner's state beside its weights, with its newest `replay_transitions`
        transitions (DQN) as far as `max_replay_bytes` holds them: what a member that copies
        this one takes (fedrl.client.training.learner_copy)."""
        return export_learner(
            self.learner, replay_transitions=replay_transitions, max_replay_bytes=max_replay_bytes
        )

    def copy_learner(
        self,
        model: Sequence[tuple[str, npt.NDArray[Any]]],
        state: Sequence[tuple[str, npt.NDArray[Any]]],
    ) -> int:
        """Become the learner `model` and `state` describe (learner_state of another member):
        its networks, optimizer state and schedule positions, its replay's transitions joining
        this one's. The actors get its weights at once, and replay-ratio credit counts from
        here, so training goes on from where that learner stood. Returns the transitions
        added; ValueError, changing nothing, if the state does not fit this learner.
        """
        added = import_learner(self.learner, model, state)
        if isinstance(self._schedule, ReplaySchedule):
            self._schedule.restart_credit()
        self._state_changed = True
        if self._started:
            self._schedule.publish()
        return added

    # -- evaluation ------------------------------------------------------------

    def _maybe_evaluate(self) -> tuple[EvalResult | None, bool]:
        if self._evaluator is None or self._tally.env_steps < self._next_eval:
            return None, False
        interval = self.config.eval_interval
        self._next_eval = (self._tally.env_steps // interval + 1) * interval
        result = self.evaluate()
        new_best = self._best_eval is None or result.mean > self._best_eval
        if new_best:
            self._best_eval = result.mean
        self._last_eval = result.mean
        return result, new_best

    def evaluate(self, weights: Sequence[tuple[str, npt.NDArray[Any]]] | None = None) -> EvalResult:
        """Greedy returns of the learner's online network, or of other weights in a copy of it.

        A copy, so evaluating another model (the global one) leaves the
        learner's networks and the actors' weights untouched.
        """
        if self._evaluator is None:
            raise RuntimeError("evaluation is disabled (eval_interval=0)")
        net = self.learner.online
        if weights is not None:
            net = copy.deepcopy(net)
            load_named_arrays(net, weights)
        return self._evaluator.run_policy(greedy_policy(net))

    def scorer(self, episodes: int) -> Scorer:
        """A greedy evaluator of other weights for another thread: its own envs, seeds and a
        CPU copy of the network, so scoring never touches the learner, its device, the
        actors or the engine's own evaluation envs (and so never changes what training does)."""
        (seed,) = self._seeds.spawn(1)
        evaluator = self._make_evaluator(episodes, seed)
        return Scorer(copy.deepcopy(self.learner.online).to("cpu"), evaluator)

    def _make_evaluator(self, episodes: int, seed: np.random.SeedSequence) -> PolicyEvaluator:
        """Greedy episodes on envs of their own; for a two-player game, `episodes` games
        against each fixed player from each seat."""
        if self.self_play is not None:
            return GameEvaluator(self.config.env, episodes=episodes, seed=seed)
        return Evaluator(
            self.config.env,
            data=self.config.data,
            episodes=episodes,
            seed=seed,
            max_steps=self.config.eval_max_steps,
            window=self._network.window,
        )

    # -- self-play -------------------------------------------------------------

    def add_global_version(
        self, version: int, tensors: Sequence[tuple[str, npt.NDArray[Any]]]
    ) -> None:
        """Two-player games: a global version the participant adopted joins the league (once,
        and at most one every snapshot interval: fedrl.client.training.self_play); other envs
        have no league, and nothing happens."""
        if self.self_play is not None:
            self.self_play.add_version(version, tensors, adopted_at=self.learner.updates)

    # -- hooks for the sync loop and autosave --------------------------------

    def actor_pids(self) -> list[int]:
        """Process ids of the live actor processes (empty in serial mode)."""
        return self._schedule.pool.pids()

    @property
    def counters(self) -> Counters:
        return Counters(
            episodes=self._tally.episodes,
            env_steps=self._tally.env_steps,
            updates=self.learner.updates,
            best_eval=self._best_eval,
            last_eval=self._last_eval,
            recent_returns=tuple(self._tally.recent),
        )

    def restore_counters(self, counters: Counters) -> None:
        """Continue from saved counters (resume). The learner's own state is restored separately."""
        self._tally.restore(counters)
        self._best_eval = counters.best_eval
        self._last_eval = counters.last_eval
        self._state_changed = True
        interval = self.config.eval_interval
        if interval:
            self._next_eval = (counters.env_steps // interval + 1) * interval

    def weights(self) -> list[tuple[str, npt.NDArray[Any]]]:
        return self.learner.weights()

    def set_weights(
        self,
        arrays: Sequence[tuple[str, npt.NDArray[Any]]],
        *,
        target: TargetAtAdoption = "reset",
    ) -> None:
        """Adopt a model (e.g. the global one) and hand it to the actors at once.

        `target` is the DQN target network's fate (Learner.set_weights); PPO has none.
        As rank 0 of several, the other ranks take it at the next exchange.
        """
        self._state_changed = True
        if isinstance(self.learner, PPOLearner):
            self.learner.set_weights(arrays)
        else:
            self.learner.set_weights(arrays, target=target)
        if self._started:
            self._schedule.publish()

    def adopt(
        self, arrays: Sequence[tuple[str, npt.NDArray[Any]]], *, target: TargetAtAdoption
    ) -> None:
        """Adopt a global model during training.

        DQN's actors get it with the next regular publish (at most
        weights_interval updates later), as they get every other change of the
        learner: adopting changes what the actors play no sooner than training
        would, so a lone participant's run stays the run it would be offline.
        PPO's actors get it at once: a rollout must come from the policy it
        updates. So do the actors of an engine that does not learn: it never
        publishes otherwise. (As rank 0 of several learners, every rank's
        actors get it when the ranks share rank 0's new state, at the next
        exchange.)
        """
        if isinstance(self.learner, PPOLearner) or not self.learns:
            self.set_weights(arrays, target=target)
        else:
            # As rank 0 of several, the other ranks take it at the next exchange.
            self._state_changed = True
            self.learner.set_weights(arrays, target=target)


def _seed_of(seed: np.random.SeedSequence) -> int:
    return int(seed.generate_state(1)[0])
