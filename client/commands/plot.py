"""`fedrl-client plot`: PNGs of training curves from metrics.jsonl and the server's global state.

Participant curves come from `<state dir>/<participant>/metrics.jsonl`, one
JSON object per line with a `kind`:

- every kind: `time` (unix seconds), `episode` (episodes done so far),
  `env_steps` (env steps done so far);
- `episode`: `return`, `length` of one finished episode;
- `eval`: `mean`, `std` of a greedy evaluation, `best` so far, `updates`;
- `train`: `updates`, `loss` after an episode batch, and DQN's `q_mean`,
  `replay_size` or PPO's `policy_loss`, `value_loss`, `entropy`, `approx_kl`;
- `sync`: `version`, `sequence`, `active_participants` at a push;
- `exploit` (population members): `generation`, `donor`, `hyperparameters`
  when the member copied a better member and explored.

Any record with a finite `loss` contributes to the loss curve, and env
steps/s is derived from consecutive (`time`, `env_steps`) pairs, so the
plots need no field beyond these. The global curve (evaluation return of
each global version, its contributors marked) comes from the server's Status
call, as a participant, or from a status file the server's operator writes
with `fedrl-server status --json` (also while the server runs). The client
never reads the server's database: its layout is the server's own.

matplotlib is an optional extra (`pip install 'fedrl[plot]'`); it is
imported only here, through its object API (no pyplot global state).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np
import numpy.typing as npt

from fedrl.client.federation.channel import ConnectionSecurity
from fedrl.client.federation.errors import ServerCallError
from fedrl.client.federation.federation_client import FederationClient
from fedrl.common.config_cli import doc, section, takes_config
from fedrl.common.config_help import ConfigCommand
from fedrl.common.identity import safe_dirname, validate_participant_id
from fedrl.common.status_file import ALL_VERSIONS, read_status_file
from fedrl.proto.v1 import federation_pb2 as pb

if TYPE_CHECKING:
    from matplotlib.figure import Figure

METRICS_FILE = "metrics.jsonl"
PLOT_INSTALL_HINT = (
    "plots need matplotlib, an optional extra: pip install 'fedrl[plot]' "
    "(or: pip install matplotlib)"
)
UNICODE_FONTS = (
    "Noto Sans CJK JP",
    "Noto Sans CJK SC",
    "WenQuanYi Zen Hei",
    "Droid Sans Fallback",
    "Arial Unicode MS",
)
"""Fonts with CJK glyphs, tried after the default one for participant and session names."""
GAP_S = 60.0
"""A pause between two records longer than this is a stopped run, not a slow one."""


class PlotError(ValueError):
    """Nothing to plot, or input that cannot be read; the message says what to do."""


@dataclass(frozen=True)
class PlotConfig:
    """The plot command."""

    state_dir: Path = field(
        default=Path("fedrl-state"),
        metadata=doc(
            "A participant's state dir, or the root of state dirs (as given to training).",
            path="dir",
        ),
    )
    participant_id: str = field(
        default="",
        metadata=doc(
            "Which participant under --state-dir; may be left out when there is only one."
        ),
    )
    server: str = field(
        default="",
        metadata=doc(
            "For the global model's curve: the server's address host:port (Status call), or a "
            "status file written by `fedrl-server status --versions 0 --json` (every version)."
        ),
    )
    session: str = field(
        default="", metadata=doc("The session to plot from --server; default: every session.")
    )
    tls: ConnectionSecurity = field(
        default_factory=ConnectionSecurity,
        metadata=section("With an address: how to reach the server."),
    )
    out: Path | None = field(
        default=None,
        metadata=doc(
            "Folder for the PNGs; default: <participant's state dir>/plots, or ./fedrl-plots.",
            path="dir",
        ),
    )
    smooth: int = field(
        default=0,
        metadata=doc(
            "Episodes in the moving average of local returns; 0 picks about 1/50 of the run."
        ),
    )

    def __post_init__(self) -> None:
        if self.smooth < 0:
            raise ValueError(f"smooth must be >= 0, got {self.smooth}")


@dataclass
class MetricsLog:
    """The records of one metrics.jsonl, by kind, and what could not be read."""

    by_kind: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    skipped: int = 0
    """Lines that were not a JSON object with a kind (e.g. the half line a kill leaves)."""
    first_problem: str = ""

    def kind(self, name: str) -> list[dict[str, Any]]:
        return self.by_kind.get(name, [])

    def all(self) -> list[dict[str, Any]]:
        return [r for records in self.by_kind.values() for r in records]


def read_metrics(path: Path) -> MetricsLog:
    """Parses every line; unreadable lines are counted and skipped, never fatal.

    The writer appends and flushes line by line, so a kill can leave one
    partial last line; skipping it (and telling the user) beats refusing to
    plot hours of training.
    """
    log = MetricsLog()
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                _skip(log, f"line {number}: not JSON ({exc.msg})")
                continue
            if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
                _skip(log, f"line {number}: not an object with a 'kind'")
                continue
            log.by_kind.setdefault(record["kind"], []).append(record)
    return log


def _skip(log: MetricsLog, problem: str) -> None:
    log.skipped += 1
    if not log.first_problem:
        log.first_problem = problem


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def series(
    records: Iterable[dict[str, Any]], x: str, *ys: str
) -> tuple[npt.NDArray[np.float64], ...]:
    """Columns x, *ys of the records where every one of them is a finite number."""
    rows = []
    for record in records:
        values = [_number(record.get(name)) for name in (x, *ys)]
        if all(v is not None for v in values):
            rows.append(values)
    table = np.asarray(rows, dtype=np.float64).reshape(-1, 1 + len(ys))
    return tuple(table[:, i] for i in range(1 + len(ys)))


def moving_average(values: npt.NDArray[np.float64], window: int) -> npt.NDArray[np.float64]:
    """Trailing mean of up to `window` values, defined from the first value on."""
    if window <= 1 or len(values) == 0:
        return values.copy()
    sums = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    starts = np.arange(1, len(values) + 1) - counts
    return (sums[1:] - sums[starts]) / counts


def step_rates(
    times: npt.NDArray[np.float64], steps: npt.NDArray[np.float64], *, bins: int = 200
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Env steps/s between successive samples, binned; pauses of a stopped run are left out.

    Returns (env steps at the end of each bin, steps/s in that bin).
    """
    order = np.argsort(steps, kind="stable")
    t, s = times[order], steps[order]
    dt, ds = np.diff(t), np.diff(s)
    running = (dt > 0) & (dt <= GAP_S) & (ds >= 0)
    if not running.any():
        return np.zeros(0), np.zeros(0)
    ends, dt, ds = s[1:][running], dt[running], ds[running]
    groups = np.array_split(np.arange(len(ends)), min(bins, len(ends)))
    x = np.array([ends[g[-1]] for g in groups])
    rate = np.array([ds[g].sum() / dt[g].sum() for g in groups])
    return x, rate


def resolve_participant_dir(state_dir: Path, participant_id: str) -> Path | None:
    """The participant's own folder: given directly, by id, or the only one there is; None if
    there is none (a participant may plot only the global curve)."""
    if participant_id:
        try:
            pid = validate_participant_id(participant_id)
        except ValueError as exc:
            raise PlotError(f"--participant-id: {exc}") from exc
        path = state_dir / safe_dirname(pid)
        return path if (path / METRICS_FILE).is_file() else None
    if (state_dir / METRICS_FILE).is_file():
        return state_dir
    if not state_dir.is_dir():
        return None
    found = sorted(p for p in state_dir.iterdir() if (p / METRICS_FILE).is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise PlotError(f"{state_dir} holds several participants ({names}); pick --participant-id")
    return found[0] if found else None


def server_status(config: PlotConfig) -> pb.StatusReply:
    """The server's status with every version, from a status file or over the network."""
    path = Path(config.server)
    if path.is_dir():
        # The database is the server's own; its status as a file travels and keeps its form.
        raise PlotError(
            f"--server {path} is a directory; plot reads a server's status, not its database: "
            f"run `fedrl-server status --data-dir {path} --versions 0 --json > status.json` "
            "and pass --server status.json"
        )
    if path.is_file():
        return _only_session(read_status_file(path), config.session, f"--server {path}")
    return asyncio.run(_fetch_status(config))


def _only_session(reply: pb.StatusReply, session: str, source: str) -> pb.StatusReply:
    if not session:
        return reply
    kept = [s for s in reply.sessions if s.session == session]
    if not kept:
        raise PlotError(f"{source}: no session named {session!r}")
    only = pb.StatusReply()
    only.CopyFrom(reply)
    del only.sessions[:]
    only.sessions.extend(kept)  # copies: `kept` still belongs to `reply`
    return only


async def _fetch_status(config: PlotConfig) -> pb.StatusReply:
    bundle = config.tls.read_bundle()
    pid = bundle.participant_id if bundle is not None else config.participant_id
    if not pid:
        raise PlotError(
            f"--server {config.server} is an address: the server answers participants only, "
            "so pass --participant-id (or --bundle)"
        )
    channel = config.tls.open(config.server, participant_id=pid)
    try:
        client = FederationClient(channel, participant_id=pid, session=config.session)
        return await client.status(max_versions=ALL_VERSIONS, all_sessions=not config.session)
    except ServerCallError as exc:
        raise PlotError(f"--server {config.server}: {exc}") from exc
    finally:
        await channel.close()


# The figures. Each returns None when its data is missing, so a fresh
# offline run still gets the plots it has data for.


def _figure(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure  # noqa: PLC0415 (optional extra)

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _unicode_family() -> list[str]:
    """The default sans-serif, then whichever installed fonts can draw CJK ids.

    matplotlib (3.6+) falls back glyph by glyph along the list, so `小明` is
    drawn where such a font exists; elsewhere it warns about the glyph.
    """
    from matplotlib import font_manager  # noqa: PLC0415 (optional extra)

    installed = {font.name for font in font_manager.fontManager.ttflist}
    return ["sans-serif", *(name for name in UNICODE_FONTS if name in installed)]


def returns_figure(log: MetricsLog, smooth: int) -> Figure | None:
    episode, ret = series(log.kind("episode"), "episode", "return")
    if len(episode) == 0:
        return None
    window = smooth or max(1, len(ret) // 50)
    fig, ax = _figure("Local episode returns", "episode", "return")
    ax.plot(episode, ret, color="tab:blue", alpha=0.25, linewidth=0.8, label="episode")
    ax.plot(episode, moving_average(ret, window), color="tab:blue", label=f"mean of last {window}")
    ax.legend(loc="best")
    return fig


def eval_figure(log: MetricsLog) -> Figure | None:
    steps, mean, std = series(log.kind("eval"), "env_steps", "mean", "std")
    if len(steps) == 0:
        return None
    fig, ax = _figure("Greedy evaluation return", "env steps", "return")
    ax.fill_between(steps, mean - std, mean + std, color="tab:green", alpha=0.2, label="± std")
    ax.plot(steps, mean, color="tab:green", marker="o", markersize=3, label="mean")
    ax.plot(steps, np.maximum.accumulate(mean), color="black", linestyle=":", label="best so far")
    for index, exploit in enumerate(log.kind("exploit")):
        ax.axvline(
            float(exploit["env_steps"]),
            color="tab:orange",
            linewidth=1,
            label="copied a better member (population)" if index == 0 else None,
        )
    ax.legend(loc="best")
    return fig


def loss_figure(log: MetricsLog) -> Figure | None:
    steps, loss = series(log.all(), "env_steps", "loss")
    if len(steps) == 0:
        return None
    order = np.argsort(steps, kind="stable")
    fig, ax = _figure("Training loss (DQN: TD; PPO: the clipped objective's)", "env steps", "loss")
    ax.plot(steps[order], loss[order], color="tab:red", linewidth=0.8)
    if (loss > 0).all():
        ax.set_yscale("log")
    return fig


def speed_figure(log: MetricsLog) -> Figure | None:
    times, steps = series(log.all(), "time", "env_steps")
    x, rate = step_rates(times, steps)
    if len(x) == 0:
        return None
    fig, ax = _figure("Collection speed", "env steps", "env steps / s")
    ax.plot(x, rate, color="tab:purple")
    # From zero, with headroom: a steady rate would otherwise sit on the frame.
    ax.set_ylim(0, 1.1 * float(rate.max()) or 1.0)
    return fig


def global_figure(session: pb.SessionState) -> Figure | None:
    """Evaluation return per global version, and below it who contributed to each version."""
    from matplotlib.figure import Figure  # noqa: PLC0415 (optional extra)
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    versions = sorted(session.versions, key=lambda v: v.version)
    if not versions:
        return None
    participants = list(dict.fromkeys(c for v in versions for c in v.contributors))
    fig = Figure(figsize=(9, 5 + 0.25 * len(participants)), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1 + 0.25 * len(participants)])
    names_font = _unicode_family()
    top.set_title(f"Global model, session {session.session}", fontfamily=names_font)
    top.set_ylabel("return")
    top.grid(alpha=0.3)
    evaluated = [v for v in versions if v.HasField("eval_return")]
    if evaluated:
        top.plot(
            [v.version for v in evaluated],
            [v.eval_return for v in evaluated],
            marker="o",
            markersize=4,
            color="tab:green",
            label="greedy evaluation of the version",
        )
    trained = [v for v in versions if v.HasField("mean_return")]
    if trained:
        top.plot(
            [v.version for v in trained],
            [v.mean_return for v in trained],
            linestyle="--",
            color="tab:blue",
            alpha=0.7,
            label="contributors' training return",
        )
    if session.HasField("best_eval_return") and session.best_version >= 0:
        top.plot(
            [session.best_version],
            [session.best_eval_return],
            marker="*",
            markersize=14,
            color="gold",
            markeredgecolor="black",
            linestyle="none",
            label=f"best: version {session.best_version}",
        )
    if evaluated or trained:
        top.legend(loc="best")
    bottom.set(xlabel="global version", ylabel="contributors")
    for row, pid in enumerate(participants):
        xs = [v.version for v in versions if pid in v.contributors]
        bottom.plot(xs, [row] * len(xs), marker="s", markersize=5, linestyle="none")
    bottom.set_yticks(range(len(participants)), participants, fontfamily=names_font)
    bottom.set_ylim(-0.5, max(0.5, len(participants) - 0.5))
    bottom.grid(alpha=0.3, axis="x")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def population_figure(session: pb.SessionState) -> Figure | None:
    """Each member's hyperparameters over its env steps, one panel per hyperparameter.

    A member's line starts at the values it joined with and steps to new ones
    at each exploit, marked ▼ with the member it copied: lineage and
    hyperparameter history in one picture.
    """
    from matplotlib.figure import Figure  # noqa: PLC0415 (optional extra)

    if not session.lineage:
        return None
    names = sorted({name for g in session.lineage for name in g.hyperparameters})
    reached = {m.participant_id: m.env_steps for m in session.members}
    members = list(dict.fromkeys(g.participant_id for g in session.lineage))
    fig = Figure(figsize=(9, 2.2 * len(names) + 1), layout="constrained")
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    names_font = _unicode_family()
    fig.suptitle(
        f"Population {session.session}: hyperparameters by member (▼ copied a better member)",
        fontfamily=names_font,
    )
    colors = {pid: f"C{index % 10}" for index, pid in enumerate(members)}
    for ax, name in zip(axes, names, strict=True):
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        for pid in members:
            generations = sorted(
                (g for g in session.lineage if g.participant_id == pid),
                key=lambda g: g.generation,
            )
            xs = [float(g.env_steps) for g in generations]
            ys = [g.hyperparameters.get(name, math.nan) for g in generations]
            end = float(max(reached.get(pid, 0), xs[-1]))
            ax.step([*xs, end], [*ys, ys[-1]], where="post", color=colors[pid], label=pid)
            for g in generations[1:]:
                ax.plot(g.env_steps, g.hyperparameters.get(name, math.nan), "v", color=colors[pid])
                if name == names[0]:
                    ax.annotate(
                        g.donor,
                        (g.env_steps, g.hyperparameters.get(name, math.nan)),
                        textcoords="offset points",
                        xytext=(4, 4),
                        fontsize=8,
                        fontfamily=names_font,
                    )
        if name in ("lr", "target_update_interval"):
            ax.set_yscale("log")
    axes[0].legend(loc="best", prop={"family": names_font})
    axes[-1].set_xlabel("the member's env steps")
    return fig


def write_plots(
    out: Path,
    log: MetricsLog | None,
    status: pb.StatusReply | None,
    *,
    smooth: int = 0,
) -> tuple[list[Path], list[str]]:
    """Writes one PNG per curve with data; returns the files and what had no data."""
    try:
        import matplotlib  # noqa: PLC0415, F401 (optional extra)
    except ImportError:
        raise PlotError(PLOT_INSTALL_HINT) from None
    figures: list[tuple[str, Figure | None, str]] = []
    if log is not None:
        figures += [
            ("returns.png", returns_figure(log, smooth), "no finished episodes"),
            ("eval.png", eval_figure(log), "no evaluations yet"),
            ("loss.png", loss_figure(log), "no loss records"),
            ("speed.png", speed_figure(log), "too few timed records for a speed"),
        ]
    if status is not None:
        for session in status.sessions:
            if session.mode == "pbt":
                name = f"population-{safe_dirname(session.session)}.png"
                figures.append(
                    (name, population_figure(session), f"session {session.session}: no members")
                )
                continue
            name = f"global-{safe_dirname(session.session)}.png"
            figures.append(
                (name, global_figure(session), f"session {session.session}: no versions")
            )
    out.mkdir(parents=True, exist_ok=True)
    written, missing = [], []
    for name, fig, reason in figures:
        if fig is None:
            missing.append(f"{name}: {reason}")
            continue
        path = out / name
        fig.savefig(path, dpi=100)
        written.append(path)
    return written, missing


def plot(config: PlotConfig) -> tuple[list[Path], list[str], MetricsLog | None]:
    """Reads what the config names and writes the PNGs."""
    participant = resolve_participant_dir(config.state_dir, config.participant_id)
    if participant is None and not config.server:
        where = config.state_dir
        if config.participant_id:
            where /= safe_dirname(validate_participant_id(config.participant_id))
        raise PlotError(
            f"nothing to plot: no {METRICS_FILE} in {where} "
            "(pass the --state-dir used for training) and no --server"
        )
    log = read_metrics(participant / METRICS_FILE) if participant is not None else None
    status = server_status(config) if config.server else None
    out = config.out or (participant / "plots" if participant is not None else Path("fedrl-plots"))
    written, missing = write_plots(out, log, status, smooth=config.smooth)
    return written, missing, log


@click.command("plot", cls=ConfigCommand)
@takes_config(PlotConfig)
def plot_command(config: PlotConfig) -> None:
    """Write PNGs of the training curves: returns, evaluations, loss, speed, the global model."""
    try:
        written, missing, log = plot(config)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if log is not None and log.skipped:
        click.echo(
            f"skipped {log.skipped} unreadable line(s) of {METRICS_FILE}; first: "
            f"{log.first_problem}",
            err=True,
        )
    for line in missing:
        click.echo(f"not plotted: {line}", err=True)
    if not written:
        raise click.ClickException("no curve has data yet; train a little first")
    for path in written:
        click.echo(f"wrote {path}")
