"""A StatusReply as aligned text tables, for terminals and `cat`.

Column widths count display cells, not code points: CJK characters take two
cells and combining marks none, so a table of ids such as `Макар` or `小明`
lines up in a terminal.
"""

from __future__ import annotations

import datetime as dt
import unicodedata
from collections.abc import Mapping, Sequence

from fedrl.common.group_rules import described
from fedrl.common.group_rules_serde import rules_from_proto
from fedrl.proto.v1 import federation_pb2 as pb


def display_width(text: str) -> int:
    """Terminal cells `text` occupies."""
    width = 0
    for char in text:
        if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def pad(text: str, width: int, *, right: bool = False) -> str:
    fill = " " * max(0, width - display_width(text))
    return fill + text if right else text + fill


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, numeric: set[int]) -> str:
    """Rows under headers, columns separated by two spaces; `numeric` columns align right."""
    widths = [display_width(h) for h in headers]
    for row in rows:
        widths = [max(w, display_width(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            pad(cell, width, right=index in numeric)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def render_status(reply: pb.StatusReply) -> str:
    """Every session of the reply: a summary, its participants and its newest versions."""
    if not reply.sessions:
        return "no sessions yet: the first participant's Join creates one"
    return "\n\n".join(render_session(session) for session in reply.sessions)


def render_session(state: pb.SessionState) -> str:
    goal = state.goal
    progress = f"{goal.episodes_done}/{goal.total_episodes} episodes"
    if goal.reached:
        progress += " (goal reached)"
    best = "none yet"
    if state.HasField("best_eval_return"):
        best = f"{state.best_eval_return:.2f} at version {state.best_version}"
        if state.best_checkpoint:
            best += f", model in {state.best_checkpoint}"
    summary = [
        f"session {state.session}  ({state.env_id or 'no env'}, spec {state.spec_hash[:12]})",
        f"  goal      {progress}",
        f"  version   {state.current_version}   env steps {state.env_steps}",
        f"  best eval {best}",
        f"  active    {state.active_participants} of {len(state.participants)} participants",
    ]
    if state.updates_quarantined:
        summary.append(f"  quarantined updates {state.updates_quarantined} (see its quarantine/)")
    if state.mode == "pbt":
        summary[0] += "  population (pbt)"
        return "\n".join(summary) + "\n\n" + render_population(state)
    rules = render_rules(state.config) if state.config.HasField("rules") else ""
    participants = table(
        [
            "participant",
            "status",
            "episodes",
            "env steps",
            "updates",
            "rejected",
            "repeats",
            "best eval",
            "last seen",
            "data",
        ],
        [
            [
                p.participant_id,
                p.status,
                str(p.episodes),
                str(p.env_steps),
                str(p.updates_accepted),
                str(p.updates_rejected),
                str(p.updates_duplicate),
                _optional(p, "best_eval_return"),
                _time(p.last_seen_unix_ms),
                f"SYNTHETIC: {p.data_source}" if p.synthetic_data else p.data_source,
            ]
            for p in state.participants
        ],
        numeric={2, 3, 4, 5, 6, 7},
    )
    rated = bool(state.ratings)
    versions = table(
        [
            "version",
            "parent",
            "created",
            "stale",
            "mean ret",
            "eval ret",
            *(["elo", "games"] if rated else []),
            "contributors",
            "checkpoint",
        ],
        [
            [
                str(v.version),
                str(v.parent),
                _time(v.created_unix_ms),
                str(v.max_staleness),
                _optional(v, "mean_return"),
                _optional(v, "eval_return"),
                *([_elo(v), str(v.rated_games)] if rated else []),
                ", ".join(v.contributors) or "-",
                v.checkpoint or "(pruned)",
            ]
            for v in state.versions
        ],
        numeric={0, 1, 3, 4, 5, 6, 7} if rated else {0, 1, 3, 4, 5},
    )
    ratings = (
        "ratings (Elo; the uniform random player is 0)\n" + render_ratings(state) if rated else ""
    )
    parts = ("\n".join(summary), rules, participants, versions, ratings)
    return "\n\n".join(part for part in parts if part)


def render_ratings(state: pb.SessionState) -> str:
    """Two-player games: every rating a participant reported, as that participant gives it."""
    return table(
        ["participant", "player", "kind", "elo", "games", "reported"],
        [
            [
                r.participant_id,
                r.name,
                r.kind,
                f"{r.rating:.0f}",
                str(r.games),
                _time(r.reported_unix_ms),
            ]
            for r in state.ratings
        ],
        numeric={3, 4},
    )


def render_rules(config: pb.SessionConfig) -> str:
    """The session's rules: each as its option, its value and what it makes the group do."""
    return table(
        ["rule", "value", "what every member does"],
        [list(row) for row in described(rules_from_proto(config.rules))],
        numeric=set(),
    )


def render_population(state: pb.SessionState) -> str:
    """A population's members (best score first) and every generation of each: its lineage."""
    members = table(
        ["member", "gen", "score", "env steps", "episodes", "ranked", "hyperparameters", "model"],
        [
            [
                m.participant_id,
                str(m.generation) + (" (adopting)" if m.adopting else ""),
                _optional(m, "score"),
                str(m.env_steps),
                str(m.episodes),
                str(m.rankings),
                hyperparameter_text(m.hyperparameters),
                m.checkpoint or "-",
            ]
            for m in state.members
        ],
        numeric={2, 3, 4, 5},
    )
    lineage = table(
        [
            "member",
            "gen",
            "from",
            "donor score",
            "own score",
            "at env steps",
            "created",
            "hyperparameters",
        ],
        [
            [
                g.participant_id,
                str(g.generation),
                f"{g.donor} gen {g.donor_generation}" if g.donor else "(joined)",
                _optional(g, "donor_score"),
                _optional(g, "score"),
                str(g.env_steps),
                _time(g.created_unix_ms),
                hyperparameter_text(g.hyperparameters),
            ]
            for g in state.lineage
        ],
        numeric={1, 3, 4, 5},
    )
    return members + "\n\nlineage\n" + lineage


def hyperparameter_text(values: Mapping[str, float]) -> str:
    """`gamma=0.99 lr=0.001`: sorted by name, four significant digits."""
    return " ".join(f"{name}={values[name]:.4g}" for name in sorted(values)) or "-"


def _optional(
    message: pb.ParticipantState | pb.VersionState | pb.MemberState | pb.MemberGeneration,
    name: str,
) -> str:
    return f"{getattr(message, name):.2f}" if message.HasField(name) else "-"


def _elo(version: pb.VersionState) -> str:
    return f"{version.rating:.0f}" if version.HasField("rating") else "-"


def _time(unix_ms: int) -> str:
    if unix_ms <= 0:
        return "-"
    return dt.datetime.fromtimestamp(unix_ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
