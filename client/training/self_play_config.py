"""The opponent pool's configuration: snapshots, what actors hold, how opponents are drawn.

A section of the engine's config (fedrl.client.training.engine_config), so
its fields are `fedrl-client` options too; only two-player games
(`pettingzoo/...`) read it (fedrl.client.training.league).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedrl.common.config_cli import doc


@dataclass(frozen=True)
class SelfPlayConfig:
    """Who a two-player game's learner plays: the pool, its snapshots and the draw."""

    snapshot_interval: int = field(
        default=2_000,
        metadata=doc(
            "Two-player games: learner updates between snapshots of the policy, and at "
            "least between two adopted global versions joining the pool."
        ),
    )
    pool_size: int = field(
        default=64,
        metadata=doc(
            "Two-player games: snapshots and global versions whose weights the opponent pool "
            "keeps; past that the oldest one's weights go (its rating stays)."
        ),
    )
    opponent_slots: int = field(
        default=8,
        metadata=doc(
            "Two-player games: pool networks the actors hold at a time, chosen again at each "
            "snapshot: an actor's memory stays the same whatever the pool's size."
        ),
    )
    latest_share: float = field(
        default=0.35,
        metadata=doc(
            "Two-player games: share of games against the latest policy itself; the rest "
            "draw an opponent from the pool and the fixed players by PFSP."
        ),
    )
    pfsp_power: float = field(
        default=2.0,
        metadata=doc(
            "Two-player games: prioritised fictitious self-play weighs an opponent by "
            "(1 − the learner's recent score against it)^this: the hardest most."
        ),
    )
    opponent_epsilon: float = field(
        default=0.05,
        metadata=doc(
            "Two-player games: network opponents play greedily but for this share of random "
            "legal moves, so that games against one opponent differ."
        ),
    )
    league_versions: int = field(
        default=8,
        metadata=doc(
            "Two-player games in a session: global versions the session keeps that join the "
            "pool at start, pulled by number (spread over its history), besides every "
            "version adopted."
        ),
    )

    def __post_init__(self) -> None:
        for name, low in (
            ("snapshot_interval", 1),
            ("pool_size", 1),
            ("opponent_slots", 1),
            ("league_versions", 0),
        ):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be at least {low}, got {getattr(self, name)}")
        for name in ("latest_share", "opponent_epsilon"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.pfsp_power < 0:
            raise ValueError(f"pfsp_power must be >= 0, got {self.pfsp_power}")
