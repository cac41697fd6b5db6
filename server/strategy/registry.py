"""The strategies by name: what --strategy, --session-strategy and SessionConfig can say.

A new strategy is its own file and its line here (and its import).
"""

from __future__ import annotations

from typing import Any

from fedrl.server.strategy.fedavg import FedAvg
from fedrl.server.strategy.median import Median
from fedrl.server.strategy.strategy import Rule, Strategy
from fedrl.server.strategy.trimmed_mean import TrimmedMean

STRATEGIES: dict[str, type[Strategy]] = {
    FedAvg.name: FedAvg,
    TrimmedMean.name: TrimmedMean,
    Median.name: Median,
}

STRATEGY_NAMES: tuple[str, ...] = tuple(STRATEGIES)
"""Names make_strategy accepts, as SessionConfig.strategy carries them."""


def make_strategy(name: str, rule: Rule | None = None, **options: Any) -> Strategy:
    """The strategy called `name` with `rule`, configured by `options` (e.g. trim_fraction=0.1)."""
    kind = _kind(name)
    unknown = sorted(set(options) - set(kind.options))
    if unknown:
        valid = ", ".join(kind.options) or "none"
        raise ValueError(
            f"strategy {name!r} takes no option {', '.join(unknown)}; its options: {valid}"
        )
    return kind(rule, **options)


def strategy_from_settings(name: str, rule: Rule, settings: object) -> Strategy:
    """The strategy `name`, its options read from the attributes of `settings` that bear their
    names (ServerConfig has a field for each)."""
    kind = _kind(name)
    return kind(rule, **{option: getattr(settings, option) for option in kind.options})


def _kind(name: str) -> type[Strategy]:
    kind = STRATEGIES.get(name)
    if kind is None:
        raise ValueError(
            f"unknown aggregation strategy {name!r}; valid names: {', '.join(STRATEGY_NAMES)}"
        )
    return kind
