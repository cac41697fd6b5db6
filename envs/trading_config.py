"""The knobs of the trading environment, validated once where they are made."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from fedrl.common.config_cli import doc, section
from fedrl.envs.market_source import MarketSource

Split = Literal["train", "eval"]


@dataclass(frozen=True, kw_only=True)
class TradingConfig:
    """Everything that defines one trading environment; `gymnasium.make` kwargs map onto it."""

    data: str | None = field(
        default=None,
        metadata=doc(
            "OHLCV bars: a CSV (plain or gzip), Parquet or Arrow file, or a PostgreSQL URL "
            "(postgresql://user@host/db; the password from PGPASSWORD, ~/.pgpass or a service "
            "file); without one, a seeded synthetic market."
        ),
    )
    source: MarketSource = field(
        default_factory=MarketSource,
        metadata=section("Which bars of --data to trade: table, columns, symbols, range."),
    )
    window: int = field(default=32, metadata=doc("Bars of features in each observation."))
    episode_length: int | None = field(
        default=256,
        metadata=doc(
            "Steps per episode, from a random start; None runs the whole split once from its start."
        ),
    )
    fee_bps: float = field(
        default=10.0,
        metadata=doc(
            "Exchange fee on each trade's notional, in basis points (10 = a typical taker fee)."
        ),
    )
    slippage_bps: float = field(
        default=5.0,
        metadata=doc("Price moved against us on each trade, in basis points of the close."),
    )
    allow_short: bool = field(
        default=True,
        metadata=doc(
            "Whether the short target position exists; without it the actions are flat and long."
        ),
    )
    split: Split = field(
        default="train",
        metadata=doc(
            'Which time split episodes come from: the early "train" bars or the late "eval" bars.'
        ),
    )
    eval_fraction: float = field(
        default=0.2,
        metadata=doc(
            "Share of the bars, the latest ones, held out for evaluation; training never sees them."
        ),
    )
    seed: int = field(
        default=0,
        metadata=doc(
            "Seed of the synthetic market: every participant must share it to train "
            "on the same market."
        ),
    )
    synthetic_bars: int = field(
        default=20_000,
        metadata=doc(
            "Length of the synthetic market in hourly bars (20 000 is a little over two years)."
        ),
    )

    def __post_init__(self) -> None:
        # Fail here, with the field's name, rather than as an index error mid-episode.
        if self.window < 1:
            raise ValueError(f"window must be at least 1 bar, got {self.window}")
        if self.episode_length is not None and self.episode_length < 1:
            raise ValueError(
                f"episode_length must be at least 1 step (or None), got {self.episode_length}"
            )
        for name in ("fee_bps", "slippage_bps"):
            value = getattr(self, name)
            if not math.isfinite(value) or not 0 <= value < 10_000:
                raise ValueError(f"{name} must be in [0, 10000) basis points, got {value}")
        if self.split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {self.split!r}")
        if not 0 < self.eval_fraction < 1:
            raise ValueError(
                f"eval_fraction must be strictly between 0 and 1, got {self.eval_fraction}"
            )
        if self.synthetic_bars < 2:
            raise ValueError(f"synthetic_bars must be at least 2, got {self.synthetic_bars}")

    @classmethod
    def from_kwargs(cls, config: TradingConfig | None = None, **kwargs: Any) -> TradingConfig:
        """`config` (or the defaults) with `kwargs` set; the source's options (symbols=...,
        table=...) may be given flat. An unknown name lists the valid ones."""
        names = {field.name for field in dataclasses.fields(cls)}
        source_names = {field.name for field in dataclasses.fields(MarketSource)}
        unknown = sorted(set(kwargs) - names - source_names)
        if unknown:
            raise TypeError(
                f"unknown trading environment option(s) {', '.join(unknown)}; "
                f"valid options: {', '.join(sorted(names | source_names))}"
            )
        base = config or cls()
        flat = {name: kwargs.pop(name) for name in source_names & set(kwargs)}
        if flat:
            kwargs["source"] = dataclasses.replace(kwargs.get("source", base.source), **flat)
        return dataclasses.replace(base, **kwargs)
