"""The ranges a request's numbers must lie in: what storage and arithmetic can hold.

One layer at the boundary: each servicer checks a request's numeric fields
here before the domain sees them, so nothing out of range reaches the update
log, the state database or the goal arithmetic. A refusal is
InvalidRequestError (INVALID_ARGUMENT) naming the field, its value and its
limit.

Why these limits:
- SQLite's INTEGER is signed 64-bit: a uint64 field stored or compared in
  SQL (sequences, counters, cursors, goals) must be at most 2^63 - 1, or the
  driver raises OverflowError after the record may already be logged.
- Counters that add up (episodes, env_steps of every push into a
  participant's and a session's totals) are each storable; their sums
  saturate at 2^63 - 1 in the database (state_db), so no sum turns into a
  float and the goal arithmetic stays exact.
- Metrics are summed too (a version's evaluation returns): at most 1e30 in
  magnitude keeps 2^63 of them finite in a float64 sum.
- Versions: -1 means "none" or "newest" where the .proto says so; other
  negative numbers name nothing. A version named in the metrics
  (evaluated_version) travels there as a float64 through the update log, so
  it is at most 2^53, exact in a float64 (no session makes that many).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.server.refusals import InvalidRequestError
from fedrl.server.storage.state_db import INT64_MAX

METRIC_BOUND = 1e30
"""Largest |metric| accepted: a float64 sum of 2^63 such values stays finite."""
VERSION_IN_METRICS_MAX = 2**53
"""Largest version a metric may name: every integer up to it is exact in a float64."""


def check_int(value: int, field: str, *, low: int, high: int = INT64_MAX) -> None:
    """Refuse `value` outside [low, high], naming the field and its range."""
    if not low <= value <= high:
        raise InvalidRequestError(f"{field} is {value}; it must lie in {low}..{high}")


def check_update_fields(
    *,
    sequence: int,
    samples: int,
    episodes: int,
    env_steps: int,
    base_version: int,
    metrics: Mapping[str, float],
) -> None:
    """The numbers of a pushed update's header (UpdateHeader): sequence, counts, metrics."""
    check_int(sequence, "UpdateHeader.sequence", low=1)
    check_int(samples, "UpdateHeader.samples", low=1)
    check_int(episodes, "UpdateHeader.episodes", low=0)
    check_int(env_steps, "UpdateHeader.env_steps", low=0)
    check_int(base_version, "UpdateHeader.base_version", low=0)
    for name, value in metrics.items():
        check_metric(value, f"UpdateMetrics.{name}")
    if "evaluated_version" in metrics:
        version = metrics["evaluated_version"]
        if not (version.is_integer() and 0 <= version <= VERSION_IN_METRICS_MAX):
            raise InvalidRequestError(
                f"UpdateMetrics.evaluated_version is {version}; "
                f"it must be a version number in 0..{VERSION_IN_METRICS_MAX}"
            )


def check_metric(value: float, field: str) -> None:
    if not (math.isfinite(value) and abs(value) <= METRIC_BOUND):
        raise InvalidRequestError(
            f"{field} is {value}; metrics must be finite and at most {METRIC_BOUND:g} in magnitude"
        )


def check_pull_model(request: pb.PullModelRequest) -> None:
    """version and have_version: -1 (newest / none) or a version number."""
    check_int(request.version, "PullModelRequest.version", low=-1)
    check_int(request.have_version, "PullModelRequest.have_version", low=-1)


def check_raise_goal(request: pb.RaiseGoalRequest) -> None:
    check_int(request.total_episodes, "RaiseGoalRequest.total_episodes", low=0)
