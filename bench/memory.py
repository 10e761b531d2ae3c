"""Peak memory and wall time as the cases grow: a cold ``evalsnap run`` on local disk.

    python -m bench.memory [--cases 3003 10010 30030] [--reuse] [--evalsnap-src DIR]
                           [--out FILE.json]

For each size, a copy of the example agent with that many distinct cases (the shop eval
set's cases over again, :func:`bench.__main__.make_agent`, its ``test_config.json``: 7
metrics, 4 of them judged by the offline judge), no model latency, a new local store,
Prefect's temporary API (the CLI's default): one whole ``evalsnap run … --json`` whose
every process is sampled every 0.5 s (:mod:`bench.rss`). Printed per size: the wall
time, the peak RSS of the largest process (the CLI's, which runs the flow) and of every
other process, the phase the peak came in (the Prefect task then running, from the run's
own temporary API's database) and the CLI's peak in each phase, and the ratios to the
first size (time against cases: linear is the cases' ratio). Issue 31's must-show: 10,010 cases at most
1 GiB in every process and at most 3.5× the 3,003-case wall; 30,030 cases at most 1.10×
the 10,010-case peak. With ``--reuse``, each cold run is followed by a ``--reuse`` run on
its store, measured the same way (its ratios are to the first size's ``--reuse`` run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.__main__ import make_agent
from bench.rss import sampled


def one(cases: int, src: str = "", reuse: bool = False) -> list[dict[str, Any]]:
    """A cold run of ``cases`` cases, and with ``reuse`` a ``--reuse`` run after it on the
    same store (no model call: every inference, unit and Prefect task result reused): wall,
    exit code, peak RSS per process (MiB) of each."""
    work = Path(tempfile.mkdtemp(prefix=f"evalsnap-memory-{cases}-"))
    try:
        agent, evalset = make_agent(work, cases)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["EVALSNAP_DEMO_LATENCY_MS"] = "0"
        env["PREFECT_HOME"] = str(work / "prefect")  # a fresh temporary API's database
        cwd = None
        if src:  # another checkout's evalsnap: `python -m` imports its working directory first
            env["PYTHONPATH"] = src
            cwd = src
        cmd = [sys.executable, "-m", "evalsnap.cli", "run", str(agent), str(evalset),
               "--store", str(work / "store"), "--json"]
        rows = [_measured(cases, "cold", cmd, env, cwd, work)]
        if reuse:
            rows.append(_measured(cases, "reuse", [*cmd, "--reuse"], env, cwd, work))
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measured(cases: int, label: str, cmd: list[str], env: dict[str, str], cwd: str | None,
              work: Path) -> dict[str, Any]:
    run = sampled(cmd, env=env, cwd=cwd, quiet=True)
    ranked = sorted(run["peaks"].items(), key=lambda kv: -kv[1]["mb"])
    if not ranked:
        raise RuntimeError(f"{cases} cases, {label}: no process was sampled (exit {run['code']})")
    pid, top = ranked[0]
    tasks = _task_runs(work / "prefect" / "prefect.db", run["started"])
    phases: dict[str, float] = {}
    for at, p, mb in run["samples"]:
        if p == pid:
            name = _phase(tasks, at)
            phases[name] = max(phases.get(name, 0), mb)
    return {"cases": cases, "run": label, "wall": run["wall"], "exit": run["code"],
            "peak_mb": top["mb"], "peak_in": _phase(tasks, top["at"]),
            "phases_mb": phases, "others_mb": [round(p["mb"]) for _, p in ranked[1:4]]}


def _task_runs(db: Path, started: float) -> list[tuple[float, float, str]]:
    """The run's Prefect task runs from its temporary API's database: (start, end) in
    seconds into the run, and the phase each is (``infer`` for every inference batch)."""
    import datetime
    import sqlite3

    def at(text: str | None) -> float:
        if not text:
            return float("inf")
        when = datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC)
        return when.timestamp() - started

    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        rows = con.execute("select name, start_time, end_time from task_run").fetchall()
    tasks = []
    for name, begin, end in rows:
        if at(end) < 0:
            continue  # a task of an earlier run (the cold run before a --reuse run)
        phase = ("infer" if name.startswith("infer ") else
                 name if name.startswith("score ") else name.rsplit("-", 1)[0])
        tasks.append((at(begin), at(end), phase))
    return sorted(tasks)


def _phase(tasks: list[tuple[float, float, str]], at: float) -> str:
    """The phase of the run ``at`` seconds in: the task running then (the latest started,
    if several), else before the first task, or after the task that ended last before."""
    running = [name for begin, end, name in tasks if begin <= at <= end]
    if running:
        return running[-1]
    ended = [(end, name) for _, end, name in tasks if end < at]
    return f"(after {max(ended)[1]})" if ended else "(start)"


def render(rows: list[dict[str, Any]]) -> str:
    """The table; the ratios of a run are to the first size's run of the same kind."""
    bases: dict[str, dict[str, Any]] = {}
    for r in rows:
        bases.setdefault(r.get("run", "cold"), r)
    lines = ["| cases | run | wall s | × wall | × cases | peak RSS MiB (CLI) | × peak | peak in "
             "| other processes MiB | exit |", "|---|---|---|---|---|---|---|---|---|---|"]
    phases: list[str] = []
    for r in rows:
        phases += [p for p in r["phases_mb"] if p not in phases]
    for r in rows:
        base = bases[r.get("run", "cold")]
        lines.append(f"| {r['cases']:,} | {r.get('run', 'cold')} | {r['wall']:.0f} | "
                     f"{r['wall'] / base['wall']:.2f}× | "
                     f"{r['cases'] / base['cases']:.2f}× | {r['peak_mb']:.0f} | "
                     f"{r['peak_mb'] / base['peak_mb']:.2f}× | {r['peak_in']} | "
                     f"{', '.join(map(str, r['others_mb']))} | {r['exit']} |")
    lines += ["", "Peak RSS of the CLI's process in each phase (MiB; the Prefect task then running):",
              "", "| phase | " + " | ".join(f"{r['cases']:,} {r.get('run', 'cold')}"
                                            for r in rows) + " |",
              "|---|" + "---|" * len(rows)]
    for p in phases:
        lines.append(f"| {p} | " + " | ".join(str(r["phases_mb"].get(p, "")) for r in rows) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.memory")
    parser.add_argument("--cases", type=int, nargs="+", default=[3003, 10010, 30030])
    parser.add_argument("--evalsnap-src", default="",
                        help="run the evalsnap of this checkout instead (a `git worktree add`)")
    parser.add_argument("--out", default="", help="also write the rows as JSON")
    parser.add_argument("--reuse", action="store_true",
                        help="after each cold run, a --reuse run on its store (no model call)")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for n in args.cases:
        for r in one(n, args.evalsnap_src, args.reuse):
            rows.append(r)
            print(f"{n} cases, {r['run']}: {r['wall']:.0f} s, peak {r['peak_mb']:.0f} MiB, "
                  f"exit {r['exit']}", file=sys.stderr, flush=True)
    print(render(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
