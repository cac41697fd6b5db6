"""Local and foreign transitions in one replay interface, each draw with a fixed foreign share.

Foreign transitions (other participants', from experience exchange) are
kept apart from local ones: with one shared ring, a participant pulling
much would overwrite its own experience, and the share would drift with
how much each side had delivered lately.

Foreign transitions must have been made with the local gamma: a discount
gamma'**k from another gamma would teach a different value function. A
different n is fine, since each transition carries its own discount.

fedrl.client.federation.experience_sync.mixed_replay builds one from the
exchange knobs; hand it to the Learner (its `replay` argument).
"""

from __future__ import annotations

import logging
import math

import numpy as np

from fedrl.client.training.experience_conversion import to_transitions
from fedrl.client.training.frame_replay import FrameReplay
from fedrl.client.training.frame_segment import FrameSegment
from fedrl.client.training.replay import PrioritizedReplay, SampledBatch
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.common.experience import ExperienceBatch

log = logging.getLogger(__name__)


class MixedReplay:
    """Local and foreign transitions in two replays; each draw takes a fixed foreign share.

    The same interface as PrioritizedReplay (add, sample, update_priorities,
    len), so the learner need not know; for frame stacks both are
    FrameReplays, and actors' frames go to the local one. Slots of the foreign replay are
    numbered after the local capacity, so priorities find their way back.
    Importance weights are those of each replay; both are at most 1.
    """

    def __init__(
        self,
        local: PrioritizedReplay | FrameReplay,
        foreign: PrioritizedReplay | FrameReplay,
        *,
        foreign_share: float,
        gamma: float,
    ) -> None:
        if not 0.0 <= foreign_share < 1.0:
            raise ValueError(f"foreign_share must lie in [0, 1), got {foreign_share}")
        if local.obs_shape != foreign.obs_shape:
            raise ValueError("local and foreign replays must hold the same observation shape")
        self.local = local
        self.foreign = foreign
        self.foreign_share = foreign_share
        self.gamma = gamma
        self.obs_shape = local.obs_shape

    def __len__(self) -> int:
        return len(self.local) + len(self.foreign)

    @property
    def nbytes(self) -> int:
        return self.local.nbytes + self.foreign.nbytes

    def add(self, batch: LearnerTransitions, *, foreign: bool = False) -> None:
        (self.foreign if foreign else self.local).add(batch)

    def add_frames(self, streams: np.ndarray, segment: FrameSegment) -> np.ndarray:
        """An actor's frames, into the local replay (a FrameReplay)."""
        if not isinstance(self.local, FrameReplay):
            raise TypeError("frame segments need a local replay that keeps frames")
        return self.local.add_frames(streams, segment)

    def transitions(self, slots: np.ndarray) -> LearnerTransitions:
        """Transitions of the local replay (a FrameReplay), stacks rebuilt."""
        if not isinstance(self.local, FrameReplay):
            raise TypeError("only a frame replay rebuilds transitions from its slots")
        return self.local.transitions(slots)

    def add_pulled(self, batch: ExperienceBatch) -> bool:
        """Add a pulled batch as foreign, unless it was made with another gamma."""
        if not math.isclose(batch.gamma, self.gamma, rel_tol=1e-6):
            log.warning(
                "skipping %d foreign transitions made with gamma %g (ours is %g)",
                len(batch),
                batch.gamma,
                self.gamma,
            )
            return False
        self.foreign.add(to_transitions(batch))
        return True

    def sample(self, batch_size: int, beta: float) -> SampledBatch:
        """Draw batch_size transitions, round(share * batch_size) of them foreign when any exist.

        Local rows come first, foreign last; the learner splits a block by
        striding, so each update's batch gets the share to within one row.
        """
        foreign = round(self.foreign_share * batch_size) if len(self.foreign) else 0
        if len(self.local) == 0:
            foreign = batch_size
        parts = []
        if batch_size - foreign:
            parts.append((self.local.sample(batch_size - foreign, beta), 0, False))
        if foreign:
            parts.append((self.foreign.sample(foreign, beta), self.local.capacity, True))
        return SampledBatch(
            batch=LearnerTransitions.concat([part.batch for part, _, _ in parts]),
            indices=np.concatenate([part.indices + offset for part, offset, _ in parts]),
            weights=np.concatenate([part.weights for part, _, _ in parts]),
            foreign=np.concatenate([np.full(len(part.indices), flag) for part, _, flag in parts]),
        )

    def update_priorities(self, indices: np.ndarray, td_abs: np.ndarray) -> None:
        indices = np.asarray(indices)
        td_abs = np.asarray(td_abs)
        is_foreign = indices >= self.local.capacity
        self.local.update_priorities(indices[~is_foreign], td_abs[~is_foreign])
        self.foreign.update_priorities(
            indices[is_foreign] - self.local.capacity, td_abs[is_foreign]
        )
