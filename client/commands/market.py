"""The market a trading run trains on: read once per run, cached in the state dir, labelled.

Actor processes, the evaluator and every learner rank build their own envs from `--data`
alone, so a source they could not read the same way (a database, or a file with --symbols or
other choices) is read here once, in the process that starts the run, and written as one
Parquet file under `<state-dir>/market-cache/`, named by the fingerprint of what was asked
(server, database, user, table or query, columns, symbols, range, bar size, indicators; a
file's path, size and modification time). Every env of the run then reads that file, so all
of them trade the same bars, and a restart with the same options reads the cache instead of
a year of bars. Delete the folder to read the source again.

`--fallback synthetic` writes the synthetic market it falls back to beside the cache, never
under the fingerprint: the next run tries the source again. The label (source, synthetic)
goes to progress lines, metrics, the saved models and the server.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path

from fedrl.client.commands.config import TrainConfig
from fedrl.client.federation.federation_client import DataLabel
from fedrl.envs.columnar_bars import market_label, write_market
from fedrl.envs.market_source import MarketSource, load_market_data
from fedrl.envs.postgres_bars import check_no_password, describe_url, is_postgres_url
from fedrl.envs.trading import ENV_ID
from fedrl.envs.trading_config import TradingConfig

logger = logging.getLogger(__name__)

CACHE_DIR = "market-cache"
SYNTHETIC_TAG = "SYNTHETIC-DATA"
"""What progress lines say of a run on synthetic bars."""


def prepare_market(config: TrainConfig) -> TrainConfig:
    """`config` with --data every env of the run can read as it is: a source that needs the
    market options is read (or found in the cache) and replaced by its cached file."""
    options = config.market
    data = config.engine.data
    if config.engine.env != ENV_ID:
        if options != MarketSource():
            raise ValueError(
                f"{_given(options)}: options of {ENV_ID}'s market; --env is {config.engine.env}"
            )
        return config
    if data is None:
        if options != MarketSource():
            raise ValueError(f"{_given(options)} choose bars of --data: give --data too")
        return config
    if not is_postgres_url(data) and options == MarketSource():
        return config
    cached = _cache_path(config.state_dir, data, options)
    if cached.exists():
        logger.warning("reading the cached bars of %s from %s", _shown(data), cached)
        return _with_data(config, cached)
    defaults = TradingConfig()
    market = load_market_data(
        data, options, seed=defaults.seed, synthetic_count=defaults.synthetic_bars
    )
    target = cached.with_name(cached.stem + ".synthetic.parquet") if market.synthetic else cached
    target.parent.mkdir(parents=True, exist_ok=True)
    write_market(market, target)
    if not market.synthetic:
        logger.warning(
            "read %d bars of %d symbol(s) from %s; cached in %s",
            market.bar_count,
            len(market.series),
            market.source,
            target,
        )
    return _with_data(config, target)


def label(config: TrainConfig) -> DataLabel | None:
    """What `config` (as prepare_market left it) trains on; None for other envs."""
    if config.engine.env != ENV_ID:
        return None
    data = config.engine.data
    if data is None:
        return DataLabel("synthetic market (no --data given)", synthetic=True)
    if is_postgres_url(data):
        return DataLabel(describe_url(data), synthetic=False)
    source, synthetic = market_label(Path(data))
    return DataLabel(source, synthetic)


def _with_data(config: TrainConfig, path: Path) -> TrainConfig:
    # The options are spent: the file holds exactly the bars they chose.
    return dataclasses.replace(
        config,
        engine=dataclasses.replace(config.engine, data=str(path)),
        market=MarketSource(),
    )


def _cache_path(state_dir: Path, data: str, options: MarketSource) -> Path:
    what: dict[str, object] = {
        "options": {k: v for k, v in dataclasses.asdict(options).items() if k != "fallback"}
    }
    if is_postgres_url(data):
        check_no_password(data)
        from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

        what["server"] = sorted((k, str(v)) for k, v in conninfo_to_dict(data).items())
        # libpq's environment chooses the server when the URL leaves it out.
        what["environment"] = sorted(
            (k, v) for k, v in os.environ.items() if k in _SERVER_VARIABLES
        )
    else:
        path = Path(data).resolve()
        stat = path.stat() if path.exists() else None
        what["file"] = [str(path), stat.st_size if stat else 0, stat.st_mtime_ns if stat else 0]
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]
    return state_dir / CACHE_DIR / f"{digest}.parquet"


_SERVER_VARIABLES = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE")


def _shown(data: str) -> str:
    return describe_url(data) if is_postgres_url(data) else data


def _given(options: MarketSource) -> str:
    default = MarketSource()
    changed = [
        "--" + f.name.replace("_", "-")
        for f in dataclasses.fields(MarketSource)
        if getattr(options, f.name) != getattr(default, f.name)
    ]
    return ", ".join(changed)
