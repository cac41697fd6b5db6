"""A PNG of the IQM score against per-participant env steps: one panel per group mode."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from bench.federation.results import RunResult
from bench.federation.settings import MODE_NAMES, Settings
from bench.federation.statistics import iqm
from bench.federation.sweep import Measured


def iqm_curve(runs: Sequence[RunResult]) -> list[float]:
    """The IQM score over seeds at each mark."""
    return [iqm(column) for column in zip(*(r.returns for r in runs), strict=True)]


def plot(measured: Sequence[Measured], path: Path, settings: Settings) -> None:
    """Each group (solid, one colour per N) beside its compute-matched lone learner (dotted)
    and its pooled learner (dash-dot); the default lone learner dashed grey in every panel."""
    modes = list(dict.fromkeys(m.group.mode for m in measured))
    # The object API needs no pyplot and so no display backend.
    figure = Figure(figsize=(4.5 * len(modes), 4), layout="tight")
    axes = figure.subplots(1, len(modes), squeeze=False, sharey=True)[0]
    for axis, mode in zip(axes, modes, strict=True):
        curves: list[tuple[Sequence[RunResult], str, str, str]] = []
        for index, m in enumerate(x for x in measured if x.group.mode == mode):
            lone = f"{m.group.algo} default lone"
            if all(label != lone for *_, label in curves):
                curves.append((m.default_lone.runs, "grey", "--", lone))
            colour = f"C{index}"
            curves.append((m.runs, colour, "-", m.group.key))
            matched = f"compute-matched lone ({m.group.key})"
            curves.append((m.compute_matched.runs, colour, ":", matched))
            if m.group.n > 1:
                curves.append((m.pooled.runs, colour, "-.", f"pooled ({m.group.key})"))
        for runs, colour, style, label in curves:
            axis.plot(runs[0].marks, iqm_curve(runs), color=colour, linestyle=style, label=label)
        axis.axhline(settings.target, color="grey", linestyle=":", linewidth=1)
        axis.set_title(MODE_NAMES[mode])
        axis.set_xlabel("env steps per participant")
        axis.legend(fontsize="x-small")
    axes[0].set_ylabel(f"greedy score, {settings.env} (IQM over seeds)")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
