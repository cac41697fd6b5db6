// The fedrl server dashboard: polls /api/status every POLL_MS and redraws.
//
// Every text that comes from the server (participant ids, session names, env
// ids, paths) reaches the screen as a text node (Node.append of a string,
// setAttribute), never through the HTML parser, so an id such as "&lt;b&gt;"
// or an env id "<script>" shows exactly as written.
"use strict";

const POLL_MS = 2000;
const VERSION_ROWS = 20;
const SVG_NS = "http://www.w3.org/2000/svg";
const CURVE = { width: 720, height: 260, left: 56, right: 16, top: 12, bottom: 40 };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  setAttributes(node, attrs);
  node.append(...children.map(asNode));
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttributes(node, attrs);
  node.append(...children.map(asNode));
  return node;
}

function setAttributes(node, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(name, String(value));
  }
}

function asNode(child) {
  return child instanceof Node ? child : document.createTextNode(child === null ? "" : String(child));
}

// Numbers as people read them; the exact value stays in data-value.

function count(n) {
  return Number(n).toLocaleString("en-US");
}

function decimal(x) {
  return x === null ? "–" : x.toFixed(1);
}

function compact(n) {
  const a = Math.abs(n);
  if (a >= 1e6) return `${+(n / 1e6).toFixed(1)}M`;
  if (a >= 1e3) return `${+(n / 1e3).toFixed(1)}k`;
  return `${+n.toFixed(2)}`;
}

function ago(ms, now) {
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 172800) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

function when(ms) {
  return new Date(ms).toLocaleString();
}

function cell(text, value, cls) {
  return el("td", { "data-value": value, class: cls }, text);
}

// One session: header, goal, figures, participants, curve, versions.

function renderSession(s, now) {
  const goal = s.goal;
  const share = goal.total_episodes ? Math.min(1, goal.episodes_done / goal.total_episodes) : 0;
  const best =
    s.best_eval_return === null ? "–" : `${decimal(s.best_eval_return)} (v${s.best_version})`;
  return el(
    "section",
    { class: "session", "data-session": s.session },
    el(
      "h2",
      {},
      "session ",
      el("span", { class: "name" }, s.session),
      el("span", { class: "env" }, s.env_id),
      el("span", { class: "strategy" }, s.strategy),
    ),
    el(
      "div",
      { class: "goal" },
      el("progress", { max: goal.total_episodes, value: goal.episodes_done }),
      el(
        "span",
        { class: "goal-text" },
        `${count(goal.episodes_done)} / ${count(goal.total_episodes)} episodes ` +
          `(${Math.floor(share * 100)}%)`,
      ),
      goal.reached ? el("span", { class: "reached" }, "goal reached") : "",
    ),
    el(
      "dl",
      { class: "figures" },
      figure("global version", s.current_version < 0 ? "none yet" : `v${s.current_version}`),
      figure("best evaluation", best),
      figure("env steps", count(s.env_steps)),
      figure("active participants", `${s.active_participants} of ${s.participants.length}`),
    ),
    s.rules.length ? el("h3", {}, "The session's rules") : "",
    s.rules.length ? rulesTable(s.rules) : "",
    el("h3", {}, "Participants"),
    participantsTable(s.participants, now),
    el("h3", {}, "Global model: greedy evaluation against env steps"),
    curve(s.versions),
    el("h3", {}, `Versions (newest ${Math.min(VERSION_ROWS, s.versions.length)})`),
    versionsTable(s.versions.slice(0, VERSION_ROWS)),
    ...(s.ratings.length ? ratingsPart(s, now) : []),
  );
}

// Two-player games: every rating participants reported, and the versions' ratings.

function ratingsPart(s, now) {
  return [
    el("h3", {}, "Global versions: Elo rating against version"),
    ratingCurve(s.versions),
    el("h3", {}, "Ratings (Elo; the uniform random player is 0)"),
    ratingsTable(s.ratings, now),
  ];
}

function ratingsTable(ratings, now) {
  const head = ["participant", "player", "kind", "rating", "games", "reported"];
  const rows = ratings.map((r) =>
    el(
      "tr",
      { "data-participant": r.participant_id, "data-player": r.name },
      el("th", { scope: "row", class: "id" }, r.participant_id),
      cell(r.name, r.name),
      cell(r.kind, r.kind),
      cell(String(Math.round(r.rating)), r.rating, "num"),
      cell(count(r.games), r.games, "num"),
      el(
        "td",
        { "data-value": r.reported_unix_ms, title: when(r.reported_unix_ms), class: "seen" },
        ago(r.reported_unix_ms, now),
      ),
    ),
  );
  return table("ratings", head, rows, "no ratings reported yet");
}

function figure(label, value) {
  return el("div", {}, el("dt", {}, label), el("dd", {}, value));
}

function rulesTable(rules) {
  const rows = rules.map((r) =>
    el(
      "tr",
      { "data-rule": r.rule },
      el("th", { scope: "row", class: "rule" }, r.rule),
      cell(r.value, r.value, "value"),
      cell(r.meaning, null, "meaning"),
    ),
  );
  return table("rules", ["rule", "value", "what every member does"], rows, "");
}

function participantsTable(participants, now) {
  const head = [
    "participant", "status", "episodes", "env steps", "updates accepted", "refused",
    "duplicates", "experience batches", "best evaluation", "last seen", "data",
  ];
  const rows = participants.map((p) =>
    el(
      "tr",
      { "data-participant": p.participant_id, class: p.status },
      el("th", { scope: "row", class: "id" }, p.participant_id),
      cell(p.status, p.status, "status"),
      cell(count(p.episodes), p.episodes, "num"),
      cell(count(p.env_steps), p.env_steps, "num"),
      cell(count(p.updates_accepted), p.updates_accepted, "num"),
      cell(count(p.updates_rejected), p.updates_rejected, "num"),
      cell(count(p.updates_duplicate), p.updates_duplicate, "num"),
      cell(count(p.experience_batches), p.experience_batches, "num"),
      cell(decimal(p.best_eval_return), p.best_eval_return, "num"),
      el(
        "td",
        { "data-value": p.last_seen_unix_ms, title: when(p.last_seen_unix_ms), class: "seen" },
        ago(p.last_seen_unix_ms, now),
      ),
      dataCell(p),
    ),
  );
  return table("participants", head, rows, "nobody has joined yet");
}

// What a participant trains on; generated bars are flagged so no one mistakes
// a synthetic run's results for a market's.
function dataCell(p) {
  if (!p.synthetic_data) return el("td", { class: "data" }, p.data_source);
  return el(
    "td",
    { class: "data synthetic", title: p.data_source },
    el("strong", {}, "SYNTHETIC DATA"),
    " ",
    p.data_source,
  );
}

function versionsTable(versions) {
  const head = [
    "version", "created", "env steps", "contributors", "max staleness", "evaluation",
    "mean return", "checkpoint",
  ];
  const rows = versions.map((v) =>
    el(
      "tr",
      { "data-version": v.version },
      el("th", { scope: "row" }, `v${v.version}`),
      cell(when(v.created_unix_ms), v.created_unix_ms),
      cell(count(v.env_steps), v.env_steps, "num"),
      cell(v.contributors.join(", "), null, "contributors"),
      cell(count(v.max_staleness), v.max_staleness, "num"),
      cell(decimal(v.eval_return), v.eval_return, "num"),
      cell(decimal(v.mean_return), v.mean_return, "num"),
      cell(v.checkpoint || "pruned", v.checkpoint, "path"),
    ),
  );
  return table("versions", head, rows, "no global model yet");
}

function table(cls, head, rows, empty) {
  const body = rows.length
    ? rows
    : [el("tr", {}, el("td", { colspan: head.length, class: "empty" }, empty))];
  return el(
    "table",
    { class: cls },
    el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, ...body),
  );
}

// The learning curve: each version's greedy evaluation (and the training
// returns its updates reported) at the env steps folded into it.

function curve(versions) {
  const ordered = versions.slice().reverse();
  const series = [
    { name: "eval", label: "greedy evaluation of the global model", key: "eval_return" },
    { name: "mean", label: "mean training return of its updates", key: "mean_return" },
  ].map((s) => ({ ...s, points: ordered.filter((v) => v[s.key] !== null) }));
  if (!series.some((s) => s.points.length)) {
    return el(
      "p",
      { class: "curve empty" },
      "No evaluations yet: participants evaluate a global version when they adopt it " +
        "(every --eval-interval env steps).",
    );
  }
  return lineChart(series, {
    x: (v) => v.env_steps,
    xLabel: "env steps",
    ariaLabel: "learning curve",
    title: (v, y) => `v${v.version}: ${decimal(y)} at ${count(v.env_steps)} env steps`,
  });
}

// Two-player games: each version's Elo rating against its number.

function ratingCurve(versions) {
  const series = [{
    name: "rating",
    label: "Elo rating of the global version (games-weighted over its raters)",
    key: "rating",
    points: versions.slice().reverse().filter((v) => v.rating !== null),
  }];
  if (!series[0].points.length) {
    return el("p", { class: "curve empty" }, "No version rated yet.");
  }
  return lineChart(series, {
    x: (v) => v.version,
    xLabel: "version",
    ariaLabel: "rating over versions",
    title: (v, y) => `v${v.version}: ${Math.round(y)} Elo from ${count(v.rated_games)} games`,
  });
}

function lineChart(series, axes) {
  const c = CURVE;
  const all = series.flatMap((s) => s.points.map((v) => v[s.key]));
  const xs = series.flatMap((s) => s.points.map(axes.x));
  const xMax = Math.max(1, ...xs);
  const yTicks = niceTicks(Math.min(0, ...all), Math.max(1, ...all), 5);
  const yLo = yTicks[0];
  const yHi = yTicks[yTicks.length - 1];
  const xTicks = niceTicks(0, xMax, 6);
  const xHi = xTicks[xTicks.length - 1];
  const px = (x) => c.left + ((c.width - c.left - c.right) * x) / xHi;
  const py = (y) => c.height - c.bottom - ((c.height - c.top - c.bottom) * (y - yLo)) / (yHi - yLo);
  const grid = [
    ...yTicks.map((t) =>
      svg("g", { class: "tick" },
        svg("line", { x1: c.left, x2: c.width - c.right, y1: py(t), y2: py(t) }),
        svg("text", { x: c.left - 6, y: py(t) + 4, "text-anchor": "end" }, compact(t))),
    ),
    ...xTicks.map((t) =>
      svg("g", { class: "tick" },
        svg("line", { x1: px(t), x2: px(t), y1: c.top, y2: c.height - c.bottom }),
        svg("text", { x: px(t), y: c.height - c.bottom + 16, "text-anchor": "middle" }, compact(t))),
    ),
    svg("text", { class: "axis", x: (c.width + c.left) / 2, y: c.height - 4, "text-anchor": "middle" },
      axes.xLabel),
  ];
  const drawn = series.map((s) =>
    svg(
      "g",
      { class: `series ${s.name}` },
      svg("polyline", {
        points: s.points.map((v) => `${px(axes.x(v))},${py(v[s.key])}`).join(" "),
      }),
      ...s.points.map((v) =>
        svg(
          "circle",
          {
            cx: px(axes.x(v)), cy: py(v[s.key]), r: 3.5,
            "data-version": v.version, "data-env-steps": v.env_steps, "data-value": v[s.key],
          },
          svg("title", {}, axes.title(v, v[s.key])),
        ),
      ),
    ),
  );
  const legend = el(
    "p",
    { class: "legend" },
    ...series.map((s) => el("span", { class: s.name }, s.label)),
  );
  return el(
    "figure",
    { class: "curve" },
    svg(
      "svg",
      { viewBox: `0 0 ${c.width} ${c.height}`, role: "img", "aria-label": axes.ariaLabel },
      ...grid,
      ...drawn,
    ),
    legend,
  );
}

function niceTicks(lo, hi, wanted) {
  const raw = (hi - lo) / wanted;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= raw);
  const first = Math.floor(lo / step) * step;
  const ticks = [];
  for (let t = first; t < hi + step; t += step) {
    ticks.push(+t.toPrecision(12));
    if (t >= hi) break;
  }
  return ticks;
}

// Polling: one request at a time; a failure shows on the page and is retried.

async function poll() {
  const status = document.getElementById("connection");
  try {
    const response = await fetch("/api/status", { cache: "no-store", credentials: "same-origin" });
    if (response.status === 401) {
      status.className = "error";
      status.replaceChildren("Your token is no longer accepted: ", el("a", { href: "/login" }, "sign in again"));
      return;
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const data = await response.json();
    const now = data.server_time_unix_ms;
    const sessions = data.sessions.map((s) => renderSession(s, now));
    document.getElementById("sessions").replaceChildren(
      ...(sessions.length ? sessions : [el("p", { class: "empty" }, "No session yet: the first participant to join creates one.")]),
    );
    status.className = "live";
    status.replaceChildren(`live · updated ${new Date(now).toLocaleTimeString()}`);
  } catch (error) {
    status.className = "error";
    status.replaceChildren(`server unreachable (${error.message}); retrying`);
  }
  setTimeout(poll, POLL_MS);
}

poll();
