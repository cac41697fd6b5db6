"""The dashboard's JSON: the Status RPC's reply, field for field, as plain JSON values.

Built from the same StatusReply the Status RPC returns (Federation.status),
so the page and the RPC cannot disagree. Not protobuf's JSON mapping, which
writes 64-bit integers as strings: every count here stays far below 2^53, so
JavaScript numbers hold them exactly. Optional fields the reply leaves unset
are null. Text (ids, env ids, paths) is passed as it is: the page inserts it
as text, never as markup.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.message import Message

from fedrl.common.group_rules import described
from fedrl.common.group_rules_serde import rules_from_proto
from fedrl.proto.v1 import federation_pb2 as pb


def status_document(reply: pb.StatusReply) -> dict[str, Any]:
    return {
        "server_time_unix_ms": reply.server_time_unix_ms,
        "sessions": [_session(state) for state in reply.sessions],
    }


def _session(state: pb.SessionState) -> dict[str, Any]:
    return {
        "session": state.session,
        "env_id": state.env_id,
        "spec_hash": state.spec_hash,
        "strategy": state.config.strategy,
        "goal": {
            "total_episodes": state.goal.total_episodes,
            "episodes_done": state.goal.episodes_done,
            "reached": state.goal.reached,
        },
        "env_steps": state.env_steps,
        "current_version": state.current_version,
        "best_version": state.best_version,
        "best_eval_return": _optional(state, "best_eval_return"),
        "best_checkpoint": state.best_checkpoint,
        "active_participants": state.active_participants,
        "rules": _rules(state),
        "participants": [_participant(p) for p in state.participants],
        "versions": [_version(v) for v in state.versions],
        "ratings": [_rating(r) for r in state.ratings],
    }


def _rules(state: pb.SessionState) -> list[dict[str, str]]:
    """The session's rules, each as its option, value and meaning (none for a population)."""
    if state.mode == "pbt" or not state.config.HasField("rules"):
        return []
    return [
        {"rule": rule, "value": value, "meaning": meaning}
        for rule, value, meaning in described(rules_from_proto(state.config.rules))
    ]


def _participant(state: pb.ParticipantState) -> dict[str, Any]:
    return {
        "participant_id": state.participant_id,
        "status": state.status,
        "first_seen_unix_ms": state.first_seen_unix_ms,
        "last_seen_unix_ms": state.last_seen_unix_ms,
        "episodes": state.episodes,
        "env_steps": state.env_steps,
        "updates_accepted": state.updates_accepted,
        "updates_rejected": state.updates_rejected,
        "updates_duplicate": state.updates_duplicate,
        "experience_batches": state.experience_batches,
        "experience_rejected": state.experience_rejected,
        "best_eval_return": _optional(state, "best_eval_return"),
        "data_source": state.data_source,
        "synthetic_data": state.synthetic_data,
    }


def _version(state: pb.VersionState) -> dict[str, Any]:
    return {
        "version": state.version,
        "parent": state.parent,
        "created_unix_ms": state.created_unix_ms,
        "contributors": list(state.contributors),
        "max_staleness": state.max_staleness,
        "env_steps": state.env_steps,
        "eval_return": _optional(state, "eval_return"),
        "mean_return": _optional(state, "mean_return"),
        "checkpoint": state.checkpoint,
        "rating": _optional(state, "rating"),
        "rated_games": state.rated_games,
    }


def _rating(state: pb.PlayerRating) -> dict[str, Any]:
    return {
        "participant_id": state.participant_id,
        "kind": state.kind,
        "name": state.name,
        "version": state.version,
        "rating": state.rating if math.isfinite(state.rating) else None,
        "games": state.games,
        "reported_unix_ms": state.reported_unix_ms,
    }


def _optional(message: Message, name: str) -> float | None:
    """An optional figure, or None when unset or not finite (JSON has no NaN)."""
    if not message.HasField(name):
        return None
    value = float(getattr(message, name))
    return value if math.isfinite(value) else None
