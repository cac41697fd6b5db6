"""The league of a two-player game's learner: its opponents, their ratings, and who plays whom.

Every opponent is an entry with an Elo rating (fedrl.client.training.elo)
and the learner's record against it: the latest policy itself, the fixed
players (random, lookahead), the learner's snapshots (one every
`snapshot_interval` updates) and the session's global versions (each one
adopted, and older ones pulled by number: fedrl.client.federation.league_sync).
The learner's own rating is the latest policy's; a snapshot starts at the
rating the learner had when it was taken, a global version at the
learner's rating when it joins. The uniform random player is the anchor,
fixed at 0, so that every participant rates on one scale.

Who the actors play (`fielded`): the latest policy with `latest_share`;
otherwise an opponent drawn by prioritised fictitious self-play (Vinyals
et al. 2019, AlphaStar): each opponent weighs f(x) = (1 − x)^p, where x is
the learner's recent score against it, so the opponents it beats least are
played most. The board holds `opponent_slots` networks, drawn by those
weights again at every snapshot; the fixed players need no slot. The
networks on the board weigh as one opponent, at the mean of their weights,
beside each fixed player, and share that weight among themselves by their
own. Counted one by one, the snapshots crowd out the look-ahead player,
the one opponent that punishes every missed block (snapshots of a learner
that misses blocks rarely do): in 30 minutes of connect four it got 12 %
of the games that way and a third of them this way (docs/games.md).

The league keeps the weights of at most `pool_size` snapshots and versions
(the oldest one's go first, its rating stays): the learner's memory is
bounded too. Its state (entries, ratings, records, weights) is what
`state_dict` saves with the participant's progress, so ratings survive a
restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from fedrl.client.training.elo import score_of, updated
from fedrl.client.training.opponent_board import MAX_ID, Fielded
from fedrl.client.training.self_play_config import SelfPlayConfig
from fedrl.envs.board_games import BASELINES
from fedrl.envs.two_player import BASELINE_IDS, FIRST_NETWORK_ID, LATEST, NO_OPPONENT

STATE_FORMAT = 1
ANCHOR = "random"
"""The fixed player whose rating stays 0: every participant's scale starts there."""
SCORE_WINDOW = 200
"""Games the recent score against an opponent averages over (an exponential average): the
learner changes, so PFSP weighs what it does now."""

Kind = Literal["latest", "baseline", "snapshot", "version"]
NamedArrays = Sequence[tuple[str, npt.NDArray[np.float32]]]


@dataclass
class Entry:
    """One opponent and the learner's record against it."""

    id: int
    kind: Kind
    name: str
    """"latest", "random", "lookahead", "snapshot 4000" (at that many updates), "version 12"."""
    rating: float
    games: int = 0
    wins: int = 0
    draws: int = 0
    losses: int = 0
    score: float = 0.5
    """The learner's recent score against it (1 win, ½ draw, 0 loss), starting even."""
    version: int = -1
    """Global versions: the version number."""
    updates: int = 0
    """Snapshots: the learner's updates when it was taken."""


@dataclass(frozen=True)
class Rating:
    """An entry's rating, as people and the server see it."""

    kind: Kind
    name: str
    rating: float
    games: int
    version: int = -1


class League:
    """Entries, ratings and the draw of opponents; the learner's process owns it."""

    def __init__(self, config: SelfPlayConfig, *, seed: int) -> None:
        self.config = config
        self._rng = np.random.default_rng(seed)
        self.entries: dict[int, Entry] = {
            LATEST: Entry(id=LATEST, kind="latest", name="latest", rating=0.0)
        }
        for name in BASELINES:
            self.entries[BASELINE_IDS[name]] = Entry(
                id=BASELINE_IDS[name], kind="baseline", name=name, rating=0.0
            )
        self._weights: dict[int, NamedArrays] = {}
        """Network entries' weights by id, oldest first (what pool_size bounds)."""
        self._next_id = FIRST_NETWORK_ID
        self._changed_versions: set[int] = set()

    # -- members -----------------------------------------------------------------

    @property
    def learner(self) -> Entry:
        return self.entries[LATEST]

    def add_snapshot(self, weights: NamedArrays, *, updates: int) -> int:
        """A snapshot of the learner's policy joins the pool at the learner's rating."""
        return self._add("snapshot", f"snapshot {updates}", weights, updates=updates)

    def add_version(self, version: int, weights: NamedArrays) -> int | None:
        """A global version joins the pool (once: None when it is there already)."""
        if any(e.kind == "version" and e.version == version for e in self.entries.values()):
            return None
        return self._add("version", f"version {version}", weights, version=version)

    def name_of(self, entry_id: int) -> str:
        """The name of an entry (what experience batches record as an opponent)."""
        return self.entries[entry_id].name

    def versions(self) -> list[int]:
        """The global versions in the league (with weights or not)."""
        return sorted(e.version for e in self.entries.values() if e.kind == "version")

    def _add(self, kind: Kind, name: str, weights: NamedArrays, **where: int) -> int:
        if self._next_id >= MAX_ID:
            raise RuntimeError(f"the league holds {MAX_ID} entries, all it can number")
        entry_id = self._next_id
        self._next_id += 1
        self.entries[entry_id] = Entry(
            id=entry_id, kind=kind, name=name, rating=self.learner.rating, **where
        )
        if kind == "version":
            self._changed_versions.add(entry_id)
        self._weights[entry_id] = [(n, np.array(a, dtype=np.float32)) for n, a in weights]
        while len(self._weights) > self.config.pool_size:
            oldest = min(self._weights)
            del self._weights[oldest]
        return entry_id

    # -- games ---------------------------------------------------------------------

    def record(self, opponents: npt.NDArray[np.int64], outcomes: npt.NDArray[np.float64]) -> None:
        """Finished games: the learner's outcome (+1, 0, −1) against each opponent id.

        Elo moves the learner and the opponent (not the anchor, and not for a
        game against itself); every game counts in the record and the recent
        score PFSP weighs.
        """
        if len(opponents) != len(outcomes):
            raise ValueError(f"{len(opponents)} opponents for {len(outcomes)} outcomes")
        learner = self.learner
        for opponent, outcome in zip(opponents.tolist(), outcomes.tolist(), strict=True):
            if opponent == NO_OPPONENT:
                continue
            entry = self.entries.get(int(opponent))
            if entry is None:
                raise ValueError(f"a game against opponent {opponent}, who is in no league here")
            score = score_of(outcome)
            entry.games += 1
            entry.wins += score == 1.0
            entry.draws += score == 0.5
            entry.losses += score == 0.0
            entry.score += (score - entry.score) / min(entry.games, SCORE_WINDOW)
            if entry.kind == "latest":
                continue
            mine, theirs = learner.rating, entry.rating
            learner.rating = updated(mine, theirs, score)
            if entry.name != ANCHOR:
                entry.rating = updated(theirs, mine, 1.0 - score)
            if entry.kind == "version":
                self._changed_versions.add(entry.id)

    # -- the draw ----------------------------------------------------------------------

    def pfsp_weight(self, entry: Entry) -> float:
        """f(x) = (1 − x)^p of the learner's recent score x against `entry`."""
        return float((1.0 - entry.score) ** self.config.pfsp_power)

    def fielded(self) -> Fielded:
        """Odds of the fixed opponents and the networks the board holds (module docstring)."""
        networks = list(self._weights)
        slots = self.config.opponent_slots
        if len(networks) > slots:
            weights = np.array([self.pfsp_weight(self.entries[i]) for i in networks]) + 1e-6
            chosen = self._rng.choice(
                len(networks), size=slots, replace=False, p=weights / weights.sum()
            )
            networks = [networks[c] for c in sorted(chosen)]
        baselines = [self.pfsp_weight(self.entries[BASELINE_IDS[name]]) for name in BASELINES]
        own = np.array([self.pfsp_weight(self.entries[i]) for i in networks])
        group = float(own.mean()) if networks else 0.0
        opponents = np.array([*baselines, group])
        if not opponents.sum() > 0:
            opponents = np.array([1.0] * len(baselines) + [1.0 if networks else 0.0])
        odds = (1.0 - self.config.latest_share) * opponents / opponents.sum()
        if not own.sum() > 0:
            own = np.ones(len(networks))
        return Fielded(
            fixed_odds=(self.config.latest_share, *odds[:-1].tolist()),
            ids=tuple(networks),
            odds=tuple((odds[-1] * own / own.sum()).tolist()) if networks else (),
            weights=tuple(self._weights[i] for i in networks),
        )

    # -- what people and the server see ---------------------------------------------

    def ratings(self) -> list[Rating]:
        """Every entry's rating: the learner first, then by id."""
        return [
            Rating(kind=e.kind, name=e.name, rating=e.rating, games=e.games, version=e.version)
            for e in sorted(self.entries.values(), key=lambda e: e.id)
        ]

    def take_version_ratings(self) -> list[Rating]:
        """Global versions whose rating changed since the last call (to report to the server)."""
        changed, self._changed_versions = self._changed_versions, set()
        return [
            Rating(kind="version", name=e.name, rating=e.rating, games=e.games, version=e.version)
            for e in (self.entries[i] for i in sorted(changed))
        ]

    # -- state -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Entries, records and kept weights: tensors, numbers and strings only."""
        return {
            "format": STATE_FORMAT,
            "next_id": self._next_id,
            "entries": [asdict(e) for e in self.entries.values()],
            "weights": {
                str(i): {name: torch.from_numpy(np.array(a)) for name, a in weights}
                for i, weights in self._weights.items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict saved; ValueError (changing nothing) if it is not that."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"league state is not of format {STATE_FORMAT}")
        try:
            entries = {int(e["id"]): Entry(**e) for e in state["entries"]}
            weights = {
                int(i): [(str(n), t.numpy().astype(np.float32)) for n, t in arrays.items()]
                for i, arrays in state["weights"].items()
            }
            next_id = int(state["next_id"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"league state is malformed: {exc}") from exc
        if not set(self.entries) <= set(entries) or not set(weights) <= set(entries):
            raise ValueError("league state lacks the fixed players or names weights of no entry")
        self.entries = entries
        self._weights = dict(sorted(weights.items()))
        self._next_id = next_id
        self._changed_versions = {i for i, e in entries.items() if e.kind == "version"}
