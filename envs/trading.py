"""`fedrl/Trading-v0`: trade one asset bar by bar; its accounting is shared with the vector env.

Timing: the observation at bar t holds features of bars up to t and the position. The action
is a target position (short, flat, long), filled at bar t's close moved against us by the
slippage, and charged the fee on the fill's notional. The reward is the change in log equity
from bar t's close to bar t+1's: exactly what the account earned, costs included, so episode
rewards sum to the log of the final equity.

A position is a number of units whose notional plus fee equals the equity at the fill (a
long spends all the cash and borrows nothing). It is held, not rebalanced, until the target
changes, so the only trades are the ones the agent asks for. An account that loses all its
equity (a short through a doubling) ends the episode as terminated.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Any, SupportsInt

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from fedrl.envs.bars import MarketData
from fedrl.envs.features import FEATURE_CLIP, WARMUP, compute_features, feature_names
from fedrl.envs.market_source import MarketSource, load_market_data
from fedrl.envs.postgres_bars import is_postgres_url
from fedrl.envs.trading_config import Split, TradingConfig

logger = logging.getLogger(__name__)

ENV_ID = "fedrl/Trading-v0"
# Equity is 1.0 at the start of every episode; below this the account is ruined. Clamping the
# reward there keeps it finite when a short loses more than everything.
RUIN_EQUITY = 1e-6
# Bound of the unrealised-return input: past +-100 % the exact size no longer guides a choice.
_UNREALISED_CLIP = 1.0

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
ObsArray = npt.NDArray[np.float32]


@dataclass(frozen=True, eq=False)
class Market:
    """Every symbol's bars and features, one symbol after another in shared arrays, and where
    each split's episodes may be in each symbol."""

    data: MarketData
    close: FloatArray
    """Closes of every symbol, symbol after symbol; a bar index points into it."""
    time_ns: IntArray
    features: npt.NDArray[np.float32]
    offsets: IntArray
    """First bar of each symbol."""
    split_at: IntArray
    """First bar of each symbol's evaluation split (its latest bars); training observes and
    trades only before it."""
    first_usable: int
    """Bars into each symbol before the first whose observation window lies past the
    feature warm-up."""

    @property
    def source(self) -> str:
        return self.data.source

    @property
    def symbols(self) -> tuple[str, ...]:
        return self.data.symbols

    def span(self, split: Split, symbol: int) -> tuple[int, int]:
        """(first, last) bar an observation of `split` may be at, in symbol number `symbol`.

        An evaluation window may reach back across the split: those bars are its past, as
        they would be for a live trader, and no training observation ever reaches forward.
        """
        first = int(self.offsets[symbol]) + self.first_usable
        end = int(self.offsets[symbol]) + len(self.data.series[symbol])
        if split == "train":
            return first, int(self.split_at[symbol]) - 1
        return max(first, int(self.split_at[symbol])), end - 1


def load_market(config: TradingConfig) -> Market:
    """The market `config` trades on; raises MarketDataError or ValueError if unusable."""
    data, features = _bars_and_features(*_data_key(config))
    lengths = np.array([len(bars) for bars in data.series], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    held_out = np.round(lengths * config.eval_fraction).astype(np.int64)
    return Market(
        data=data,
        close=np.concatenate([bars.close for bars in data.series]),
        time_ns=np.concatenate([bars.time_ns for bars in data.series]),
        features=features,
        offsets=offsets,
        split_at=offsets + lengths - held_out,
        first_usable=WARMUP + config.window - 1,
    )


_DataKey = tuple[str | None, int, int, MarketSource, int, int]


def _data_key(config: TradingConfig) -> _DataKey:
    """A cache key that changes when a file does, so an edited CSV is read again."""
    synthetic = (config.seed, config.synthetic_bars)
    if config.data is None or is_postgres_url(config.data):
        return config.data, 0, 0, config.source, *synthetic
    path = os.path.abspath(config.data)
    try:
        stat = os.stat(path)
    except OSError:
        # The reader reports the missing or unreadable file with its name.
        return path, 0, 0, config.source, *synthetic
    return path, stat.st_mtime_ns, stat.st_size, config.source, *synthetic


# Envs of one process share one read-only copy: a 1M-bar file is read and featurised once.
@functools.lru_cache(maxsize=4)
def _bars_and_features(
    data: str | None,
    _mtime_ns: int,
    _size: int,
    source: MarketSource,
    seed: int,
    synthetic_count: int,
) -> tuple[MarketData, npt.NDArray[np.float32]]:
    market = load_market_data(data, source, seed=seed, synthetic_count=synthetic_count)
    if not market.synthetic:
        logger.info(
            "trading on %d bars of %d symbol(s) from %s",
            market.bar_count,
            len(market.series),
            market.source,
        )
    features = np.concatenate([compute_features(bars) for bars in market.series])
    features.setflags(write=False)
    return market, features


@dataclass(frozen=True)
class Starts:
    """Where `config`'s episodes may start and must end, per symbol."""

    lowest: IntArray
    highest: IntArray
    last: IntArray

    def draw(self, rng: np.random.Generator, symbol: int | None = None) -> tuple[int, int]:
        """(symbol, first bar) of an episode: the symbol uniform (unless given), then the
        start uniform over its allowed ones. One symbol draws exactly what the single env
        always drew, so single and vector envs keep matching trajectories."""
        if symbol is None:
            symbol = 0 if len(self.lowest) == 1 else int(rng.integers(len(self.lowest)))
        return symbol, draw_start(rng, int(self.lowest[symbol]), int(self.highest[symbol]))


def episode_starts(market: Market, config: TradingConfig) -> Starts:
    """Each symbol's (lowest start, highest start, last bar) for `config`'s episodes, or a
    ValueError saying which symbol is too short and which knob to change."""
    length = config.episode_length
    needed = 2 if length is None else length + 1
    lowest, highest, last = [], [], []
    for k, bars in enumerate(market.data.series):
        first, end = market.span(config.split, k)
        usable = end - first + 1
        if usable < needed:
            raise ValueError(
                f"the {config.split} split of {bars.label} has {max(usable, 0)} usable bars "
                f"(of {len(bars)}; {WARMUP} warm-up bars for the features and "
                f"window={config.window} come first, eval_fraction={config.eval_fraction} "
                f"is held out), but an episode needs {needed}: lower episode_length or window, "
                "change eval_fraction, leave the symbol out, or give more data"
            )
        lowest.append(first)
        highest.append(first if length is None else end - length)
        last.append(end)
    as_array = functools.partial(np.array, dtype=np.int64)
    return Starts(lowest=as_array(lowest), highest=as_array(highest), last=as_array(last))


def target_positions(allow_short: bool) -> npt.NDArray[np.int8]:
    """Target position of each action: short, flat, long (or flat, long)."""
    return np.array([-1, 0, 1] if allow_short else [0, 1], dtype=np.int8)


def observation_space(window: int, indicators: tuple[str, ...] = ()) -> gym.spaces.Box:
    """Flat window of features, oldest bar first, then position and unrealised return. It
    depends on the indicator columns, never on the symbols: one network trades any of them."""
    size = window * len(feature_names(indicators))
    low = np.concatenate([np.full(size, -FEATURE_CLIP), [-1.0, -_UNREALISED_CLIP]])
    high = np.concatenate([np.full(size, FEATURE_CLIP), [1.0, _UNREALISED_CLIP]])
    return gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)


class Book:
    """The accounts of N independent episodes as arrays, so one numpy call steps them all."""

    def __init__(self, *, n: int, close: FloatArray, fee_bps: float, slippage_bps: float) -> None:
        self._close = close
        self._fee = fee_bps / 10_000
        self._slippage = slippage_bps / 10_000
        self.bar = np.zeros(n, dtype=np.int64)
        self.steps = np.zeros(n, dtype=np.int64)
        self.cash = np.ones(n)
        self.units = np.zeros(n)
        self.position = np.zeros(n, dtype=np.int8)
        self.entry_price = np.ones(n)

    def open(self, which: npt.NDArray[np.intp] | slice, start: IntArray | int) -> None:
        """Start accounts `which` flat with equity 1 at bar `start`."""
        self.bar[which] = start
        self.steps[which] = 0
        self.cash[which] = 1.0
        self.units[which] = 0.0
        self.position[which] = 0
        self.entry_price[which] = 1.0

    def equity(self) -> FloatArray:
        """Cash plus the position marked at the current bar's close."""
        return self.cash + self.units * self._close[self.bar]

    def step(
        self, target: npt.NDArray[np.int8], advance: npt.NDArray[np.bool_] | None = None
    ) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
        """Trade to `target` at this close, move `advance` accounts (all if None) one bar on.

        Returns (log-equity rewards, ruined). An account not advanced must keep its position.
        """
        price = self._close[self.bar]
        before = self.cash + self.units * price
        trade = target != self.position
        if trade.any():
            # Units only grow from short to flat to long, so the target says the trade's side.
            fill = price * (1 + self._slippage * np.sign(target - self.position))
            # Size so that notional plus fee equals the equity: a long spends all the cash and
            # borrows nothing.
            wanted = np.where(trade, target * before / (fill * (1 + self._fee)), self.units)
            bought = wanted - self.units
            self.cash -= bought * fill + self._fee * np.abs(bought) * fill
            self.units = wanted
            self.entry_price = np.where(trade, fill, self.entry_price)
            self.position = target.copy()
        step = np.ones_like(self.bar) if advance is None else advance.astype(np.int64)
        self.bar += step
        self.steps += step
        after = self.cash + self.units * self._close[self.bar]
        ruined = after <= RUIN_EQUITY
        rewards = np.log(np.maximum(after, RUIN_EQUITY) / before)
        return rewards, ruined

    def unrealised_return(self) -> FloatArray:
        """Return of the open position since its fill; 0 when flat."""
        moved = self._close[self.bar] / self.entry_price - 1
        return np.clip(self.position * moved, -_UNREALISED_CLIP, _UNREALISED_CLIP)


def observe(market: Market, book: Book, window: int) -> ObsArray:
    """(N, obs size) observations: each account's feature window, position, unrealised return."""
    rows = book.bar[:, None] + np.arange(1 - window, 1)
    frames = market.features[rows].reshape(len(book.bar), -1)
    extra = np.stack([book.position, book.unrealised_return()], axis=1).astype(np.float32)
    return np.concatenate([frames, extra], axis=1)


def draw_start(rng: np.random.Generator, lowest: int, highest: int) -> int:
    """An episode's first bar, uniform over the allowed starts (the single env's and the
    vector env's sub-envs draw identically, so their trajectories match)."""
    return lowest if lowest == highest else int(rng.integers(lowest, highest + 1))


class TradingEnv(gym.Env[npt.NDArray[Any], np.int64]):
    """One account trading one market; `gymnasium.make("fedrl/Trading-v0", data=..., ...)`.

    With many symbols each episode trades one, drawn at reset; `reset(options={"symbol":
    "AAPL"})` picks it instead.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (Gymnasium's convention)

    def __init__(
        self, config: TradingConfig | None = None, *, render_mode: str | None = None, **options: Any
    ) -> None:
        if render_mode is not None:
            raise ValueError(f"{ENV_ID} has no render modes, got render_mode={render_mode!r}")
        self.config = TradingConfig.from_kwargs(config, **options)
        self.market = load_market(self.config)
        self._starts = episode_starts(self.market, self.config)
        self._targets = target_positions(self.config.allow_short)
        self.n_actions = len(self._targets)
        self.action_space = gym.spaces.Discrete(self.n_actions)
        space = observation_space(self.config.window, self.market.data.indicator_names)
        self.obs_shape: tuple[int, ...] = space.shape
        self.observation_space = space
        self._book = Book(
            n=1,
            close=self.market.close,
            fee_bps=self.config.fee_bps,
            slippage_bps=self.config.slippage_bps,
        )
        self._symbol = 0
        self._started = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsArray, dict[str, Any]]:
        super().reset(seed=seed)
        asked = (options or {}).get("symbol")
        if asked is not None and asked not in self.market.symbols:
            raise ValueError(
                f"symbol {asked!r} is not in this market: {', '.join(self.market.symbols)}"
            )
        chosen = None if asked is None else self.market.symbols.index(asked)
        self._symbol, start = self._starts.draw(self.np_random, chosen)
        self._book.open(slice(None), start)
        self._started = True
        return observe(self.market, self._book, self.config.window)[0], self._info()

    def step(self, action: SupportsInt) -> tuple[ObsArray, float, bool, bool, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step(): the episode has ended or not begun")
        if not self.action_space.contains(action):
            raise ValueError(
                f"action {action!r} is not in {self.action_space} (targets: "
                f"{', '.join(_POSITION_NAMES[int(p)] for p in self._targets)})"
            )
        rewards, ruined = self._book.step(self._targets[[int(action)]])
        terminated = bool(ruined[0])
        truncated = not terminated and (
            int(self._book.bar[0]) >= int(self._starts.last[self._symbol])
            or (
                self.config.episode_length is not None
                and int(self._book.steps[0]) >= self.config.episode_length
            )
        )
        if terminated or truncated:
            self._started = False
        obs = observe(self.market, self._book, self.config.window)[0]
        return obs, float(rewards[0]), terminated, truncated, self._info()

    def _info(self) -> dict[str, Any]:
        bar = int(self._book.bar[0])
        return {
            "bar": bar,
            "symbol": self.market.symbols[self._symbol],
            "time_ns": int(self.market.time_ns[bar]),
            "equity": float(self._book.equity()[0]),
            "position": int(self._book.position[0]),
        }


_POSITION_NAMES = {-1: "short", 0: "flat", 1: "long"}
