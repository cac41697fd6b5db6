"""The GPU check: learner updates per second, `fedrl-client check`, and an offline game run.

Three parts, each in a subprocess under a time limit of its own, so one
that fails leaves the others' figures; together they take under 8 minutes
on one H100 (`make bench-gpu` also installs fedrl over the node's torch
first, scripts/bench_gpu.sh). Everything lands in one JSON file, also printed as the last line.

1. bench/learner.py: the MLP and the Nature CNN at batch 32, 64, 256 and
   512: the SB3-style eager step, the plain captured step (the anchor) and
   fedrl's learner (device update, host update, bf16).
2. `fedrl-client check --env ALE/Breakout-v5 --json`.
3. `fedrl-client --offline --env ALE/Breakout-v5 --replay-ratio 0.25`,
   stopped with Ctrl-C (SIGINT) after 120 s: env steps and updates per
   second from its metrics.jsonl, and the replay ratio it kept.

    python bench/gpu.py [--out bench-gpu.json] [--device cuda] [--env ALE/Breakout-v5]
        [--seconds 120] [--quick]

`--device cpu --env CartPole-v1 --seconds 10 --quick` runs the same parts
on a machine without a GPU (the tests do; `make bench` runs `--quick`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
REPLAY_RATIO = 0.25
LEARNER_BUDGET_S = 180
"""bench/learner.py begins no batch size after this (it then has 90 s to end); with the
check's 100 s and the offline run's 120 s and STOP_S, the whole stays under 8 minutes."""
STOP_S = 30
"""How long the offline run may take to save and stop after Ctrl-C."""


def client_command() -> list[str]:
    """fedrl-client of this interpreter's environment (its console script, beside it)."""
    return [str(Path(sys.executable).parent / "fedrl-client")]


def last_json(text: str) -> dict[str, Any]:
    """The JSON object on the last non-empty line of a command's output."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the command printed nothing")
    parsed: dict[str, Any] = json.loads(lines[-1])
    return parsed


def run_part(command: list[str], timeout_s: float) -> dict[str, Any]:
    """A part's JSON, or what went wrong (exit status, the end of its output)."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as expired:
        tail = (expired.stderr or b"")[-2000:]
        return {"error": f"timed out after {timeout_s:.0f} s", "stderr_tail": str(tail)}
    if done.returncode != 0:
        return {"error": f"exit status {done.returncode}", "stderr_tail": done.stderr[-2000:]}
    try:
        return last_json(done.stdout)
    except ValueError as error:
        return {"error": f"no JSON on the last line: {error}", "stdout_tail": done.stdout[-2000:]}


def rates(records: list[dict[str, Any]], *, replay_ratio: float) -> dict[str, Any]:
    """Env steps and updates per second of an offline run from its metrics.jsonl records,
    over the span where the learner trained (first to last "train" record)."""
    trained = [r for r in records if r.get("kind") == "train" and r.get("updates", 0) > 0]
    if len(trained) < 2:
        return {"error": f"{len(trained)} train records with updates: too short to rate"}
    first, last = trained[0], trained[-1]
    seconds = last["time"] - first["time"]
    steps = last["env_steps"] - first["env_steps"]
    updates = last["updates"] - first["updates"]
    if seconds <= 0 or steps <= 0:
        return {"error": "no time or no env steps between the first and last train record"}
    return {
        "seconds_rated": round(seconds, 1),
        "env_steps": last["env_steps"],
        "updates": last["updates"],
        "env_steps_per_s": round(steps / seconds, 1),
        "updates_per_s": round(updates / seconds, 1),
        "replay_ratio_asked": replay_ratio,
        "replay_ratio_kept": round(updates / steps, 4),
    }


def offline_run(env: str, seconds: float, device: str, state: Path) -> dict[str, Any]:
    """Train alone for `seconds`, then Ctrl-C; the rates from the metrics it wrote."""
    command = [
        *client_command(),
        "--offline",
        "--participant-id",
        "bench-gpu",
        "--env",
        env,
        "--device",
        device,
        "--replay-ratio",
        str(REPLAY_RATIO),
        "--episodes",
        "100000000",
        "--state-dir",
        str(state),
        "--log-interval",
        "10",
    ]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        started = time.perf_counter()
        while process.poll() is None and time.perf_counter() - started < seconds:
            time.sleep(1.0)
        ran = time.perf_counter() - started
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # the client saves and stops
            try:
                process.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.seek(0)
        tail = log.read().decode(errors="replace")[-3000:]
    metrics = [
        json.loads(line)
        for path in state.rglob("metrics.jsonl")
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    figures = rates(metrics, replay_ratio=REPLAY_RATIO)
    figures.update({"ran_s": round(ran, 1), "exit_status": process.returncode, "log_tail": tail})
    return figures


def machine() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in load],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-gpu.json"))
    parser.add_argument("--device", default="auto", help='"auto", "cuda" or "cpu"')
    parser.add_argument("--env", default="ALE/Breakout-v5")
    parser.add_argument("--seconds", type=float, default=None, help="offline run (120; quick 30)")
    parser.add_argument("--quick", action="store_true", help="a smoke run of every part")
    args = parser.parse_args()
    args.seconds = args.seconds or (30.0 if args.quick else 120.0)

    started = time.perf_counter()
    report: dict[str, Any] = {"bench": "gpu", "machine": machine(), "env": args.env}
    learner = [sys.executable, str(HERE / "learner.py"), "--device", args.device]
    if args.quick:
        learner += ["--quick", "--nets", "mlp", "--batch-sizes", "32", "--updates", "20"]
    else:
        # ~3 minutes on an H100: the MLP's sb3-eager and host steps (~300/s) dominate.
        learner += ["--nets", "mlp,cnn", "--batch-sizes", "32,64,256,512", "--rounds", "3"]
        learner += ["--updates", "1000", "--budget-s", str(LEARNER_BUDGET_S)]
    print("== bench/learner.py", flush=True)
    report["learner"] = run_part(learner, timeout_s=LEARNER_BUDGET_S + 90)
    print("== fedrl-client check", flush=True)
    check = [*client_command(), "check", "--env", args.env, "--json"]
    report["check"] = run_part(check + (["--quick"] if args.quick else []), timeout_s=100)
    print(f"== fedrl-client --offline, {args.seconds:.0f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="fedrl-bench-gpu-") as state:
        report["offline"] = offline_run(args.env, args.seconds, args.device, Path(state))
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    failed = [part for part in ("learner", "check", "offline") if "error" in report[part]]
    report["failed"] = failed
    text = json.dumps(report, ensure_ascii=False)
    args.out.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {args.out} in {report['elapsed_s']:.0f} s; failed parts: {failed or 'none'}")
    print(text)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
