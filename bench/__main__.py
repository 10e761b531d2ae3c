"""Benchmarks: evalsnap against ADK's own LocalEvalService, same cases, same invocation.

    python -m bench --suite        # every table bench/RESULTS.md publishes (`make bench`)
    python -m bench [--sizes 30 300] [--reps 3] [--scenarios 1 2 3 4 5 6] [--api env|server]
                    [--out FILE]    # printed; written into FILE's generated block if given

Run it from the repository root: ``bench/`` and ``examples/`` are not installed with evalsnap.

Every measurement is a whole process (wall time, and peak RSS of the process tree via a wrapper), alternating
ADK and evalsnap, medians over ``--reps``; ratios are evalsnap / ADK from the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHOP = ROOT / "examples" / "shop_agent"


def make_agent(workdir: Path, n: int) -> tuple[Path, Path]:
    """A copy of the example agent with an eval set of ``n`` distinct cases."""
    agent = workdir / "shop_agent"
    shutil.copytree(SHOP, agent, ignore=shutil.ignore_patterns("__pycache__", ".adk"))
    base = json.loads((SHOP / "shop.evalset.json").read_text())
    cases = []
    for i in range(n):
        case = json.loads(json.dumps(base["eval_cases"][i % len(base["eval_cases"])]))
        case["eval_id"] = f"{case['eval_id']}-{i}"
        first = case["conversation"][0]["user_content"]["parts"][0]
        first["text"] = f"{first['text']} #{i}"  # distinct inputs: no accidental sharing
        cases.append(case)
    evalset = agent / "bench.evalset.json"
    evalset.write_text(json.dumps({**base, "eval_set_id": f"bench{n}", "eval_cases": cases}))
    return agent, evalset


def measure(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> dict[str, Any]:
    """Runs ``cmd`` in ``cwd`` (default: the repository root, whose evalsnap ``python -m``
    then imports before any ``PYTHONPATH``)."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=cwd or ROOT)
    out, err = proc.communicate()
    wall = time.monotonic() - started
    # Peak RSS comes from `wrapped`: a fresh wrapper process whose only child is the command.
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"{cmd} printed no JSON (exit {proc.returncode}): {err.decode()[-2000:]}")
    return {"wall": wall, "code": proc.returncode, **json.loads(lines[-1])}


def wrapped(cmd: list[str]) -> list[str]:
    """Runs ``cmd`` and appends its peak RSS (MiB) to its JSON output line."""
    code = (
        "import json,os,subprocess,sys;"
        "p=subprocess.Popen(sys.argv[1:],stdout=subprocess.PIPE);o,_=p.communicate();"
        "import resource;r=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024;"
        "ls=[l for l in o.decode().splitlines() if l.startswith('{')];"
        "d=json.loads(ls[-1]) if ls else {};d['rss_mb']=r;d['exit']=p.returncode;print(json.dumps(d))"
    )
    return [sys.executable, "-c", code, *cmd]


def adk_cmd(agent: Path, evalset: Path) -> list[str]:
    return wrapped([sys.executable, "-m", "bench._adk_run", str(agent), str(evalset),
                    str(agent / "test_config.json")])


def evalsnap_cmd(*args: str) -> list[str]:
    return wrapped([sys.executable, "-m", "evalsnap.cli", *args, "--json"])


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(sizes: list[int], reps: int, scenarios: set[int],
        judge_concurrency: int = 16, api_url: str | None = None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    # The configured rate limit: judge requests in flight per process (ADK has no such knob).
    # No PYTHONPATH: evalsnap runs as installed, and the demo's models come from the copied
    # agent's own config (evalsnapPlugins), as in production; bench._adk_run imports from
    # the working directory (the repository root).
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    base_env["EVALSNAP_JUDGE_CONCURRENCY"] = str(judge_concurrency)
    if api_url is not None:
        base_env["PREFECT_API_URL"] = api_url
    for n in sizes:
        work = Path(tempfile.mkdtemp(prefix=f"evalsnap-bench-{n}-"))
        agent, evalset = make_agent(work, n)
        for latency in ([0] if 1 in scenarios else []) + ([50] if 2 in scenarios else []):
            env = {**base_env, "EVALSNAP_DEMO_LATENCY_MS": str(latency)}
            adk, ours = [], []
            for r in range(reps):
                adk.append(measure(adk_cmd(agent, evalset), env))
                store = work / f"store-cold-{latency}-{r}"
                ours.append(measure(evalsnap_cmd("run", str(agent), str(evalset), "--store",
                                                 str(store)), env))
            rows.append({"scenario": 1 if latency == 0 else 2, "n": n, "latency_ms": latency,
                         "adk_wall": median([a["wall"] for a in adk]),
                         "evalsnap_wall": median([o["wall"] for o in ours]),
                         "adk_rss_mb": median([a["rss_mb"] for a in adk]),
                         "evalsnap_rss_mb": median([o["rss_mb"] for o in ours])})
        if scenarios & {3, 4, 5}:
            env = {**base_env, "EVALSNAP_DEMO_LATENCY_MS": "50"}
            store = work / "store-warm"
            cold = measure(evalsnap_cmd("run", str(agent), str(evalset), "--store", str(store)),
                           env)
            adk_cold = measure(adk_cmd(agent, evalset), env)
            if 3 in scenarios:
                warm = [measure(evalsnap_cmd("run", str(agent), str(evalset), "--store",
                                             str(store), "--reuse"), env) for _ in range(reps)]
                rows.append({"scenario": 3, "n": n, "adk_wall": adk_cold["wall"],
                             "evalsnap_wall": median([w["wall"] for w in warm]),
                             "agent_calls": warm[-1]["agent_calls"],
                             "judge_calls": warm[-1]["judge_calls"]})
            if 4 in scenarios:
                edited = json.loads(evalset.read_text())
                case = edited["eval_cases"][0]
                case["conversation"][-1]["final_response"]["parts"][0]["text"] += " Enjoy!"
                ev2 = agent / "edited.evalset.json"
                ev2.write_text(json.dumps(edited))
                res = measure(evalsnap_cmd("rescore", cold["run_id"], "--evalset", str(ev2),
                                           "--config", str(agent / "test_config.json"),
                                           "--store", str(store), "--reuse"), env)
                rows.append({"scenario": 4, "n": n, "adk_wall": adk_cold["wall"],
                             "evalsnap_wall": res["wall"], "judge_calls": res["judge_calls"],
                             "scored_units": res["scored_units"],
                             "reused_units": res["reused_units"],
                             "cold_wall": cold["wall"],
                             "of_cold": res["wall"] / cold["wall"]})
            if 5 in scenarios:
                cfg = json.loads((agent / "test_config.json").read_text())
                crit = cfg["criteria"]["final_response_match_v2"]
                crit["threshold"] = 0.75
                cfg2 = agent / "threshold.test_config.json"
                cfg2.write_text(json.dumps(cfg))
                res = measure(evalsnap_cmd("rescore", cold["run_id"], "--evalset", str(evalset),
                                           "--config", str(cfg2), "--store", str(store),
                                           "--reuse"), env)
                rows.append({"scenario": 5, "n": n, "evalsnap_wall": res["wall"],
                             "judge_calls": res["judge_calls"],
                             "scored_units": res["scored_units"]})
        if 6 in scenarios:
            env = {**base_env, "EVALSNAP_DEMO_LATENCY_MS": "0"}
            adk_size = measure(adk_cmd(agent, evalset), env)
            store = work / "store-size"
            res = measure(evalsnap_cmd("run", str(agent), str(evalset), "--store", str(store)),
                          env)
            size = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
            rows.append({"scenario": 6, "n": n, "adk_wall": adk_size["wall"],
                         "evalsnap_wall": res["wall"], "adk_rss_mb": adk_size["rss_mb"],
                         "evalsnap_rss_mb": res["rss_mb"], "store_mb": size / 2**20,
                         "store_kb_per_case": size / 1024 / n})
        shutil.rmtree(work, ignore_errors=True)
    return rows


@contextmanager
def prefect_server() -> Iterator[str]:
    """A ``prefect server`` on 127.0.0.1 for the bench's evalsnap runs (the production
    set-up: a scheduled run talks to a running server); stopped by PID afterwards."""
    from evalsnap.startup import _free_port, wait_healthy

    home = Path(tempfile.mkdtemp(prefix="evalsnap-bench-prefect-"))
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": "",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false"}
    log = open(home / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start",
                             "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=log,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    try:
        if not wait_healthy(url, proc, timeout=90):
            raise RuntimeError("prefect server did not start: "
                               + (home / "server.log").read_text()[-2000:])
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(home, ignore_errors=True)


def render(sections: list[tuple[Section, list[dict[str, Any]]]],
           args: argparse.Namespace, started: float) -> str:
    """The generated block: the machine and the code measured, then one table per section."""
    api = os.environ.get("PREFECT_API_URL")
    lines = [f"Generated by `python -m bench {' '.join(sys.argv[1:])}` on "
             f"{platform.platform()}, Python {platform.python_version()}, "
             f"{os.cpu_count()} cores, {_memory()}, "
             f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(started))}-"
             f"{time.strftime('%H:%M UTC', time.gmtime())}, commit {_commit()}.", "",
             "Medians of whole-process runs, ADK and evalsnap alternating; ratio = evalsnap / "
             "ADK's `LocalEvalService` (`perform_inference` + `evaluate`, in-memory eval sets "
             "manager, its default parallelism) from the same invocation. evalsnap's configured "
             f"judge limit: {args.judge_concurrency} requests in flight "
             "(`EVALSNAP_JUDGE_CONCURRENCY`); everything else at its defaults. Peak RSS is the "
             "largest process of a run (for evalsnap: its CLI, its API server or its scoring "
             "process)."]
    for section, rows in sections:
        where = ("a running `prefect server` on 127.0.0.1 started by the runner"
                 if section.api == "server" else
                 f"`PREFECT_API_URL={api}`" if api else
                 "the temporary one each run starts (no `PREFECT_API_URL`)")
        lines += ["", f"`--sizes {' '.join(map(str, section.sizes))} --reps {section.reps} "
                      f"--scenarios {' '.join(map(str, section.scenarios))} --api "
                      f"{section.api}`; Prefect API: {where}.", "",
                  "| scenario | N | ADK wall s | evalsnap wall s | ratio | details |",
                  "|---|---|---|---|---|---|"]
        for r in rows:
            ratio = (r["evalsnap_wall"] / r["adk_wall"]) if r.get("adk_wall") else None
            details = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()
                       if k not in ("scenario", "n", "adk_wall", "evalsnap_wall")}
            lines.append(f"| {r['scenario']} | {r['n']} | "
                         f"{r.get('adk_wall', float('nan')):.2f} | {r['evalsnap_wall']:.2f} | "
                         f"{'' if ratio is None else f'{ratio:.2f}×'} | {json.dumps(details)} |")
    return "\n".join(lines) + "\n"


def _memory() -> str:
    try:
        return f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (ValueError, OSError):
        return "memory unknown"


def _commit() -> str:
    """The checked-out commit, marked ``+changes`` when the tree differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD") or "unknown"
        return head + (" +changes" if git("status", "--porcelain", "--untracked-files=no")
                       else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass(frozen=True)
class Section:
    """One table: evalsnap against ADK at these sizes and scenarios, on one kind of API."""
    sizes: tuple[int, ...]
    reps: int
    scenarios: tuple[int, ...]
    api: str  # "env": as the environment says; "server": a `prefect server` of the runner's


# What `bench/RESULTS.md` publishes (`--suite`, `make bench`): about 20 minutes on 2 cores.
SUITE = (Section((300, 30), 3, (1, 2, 3, 4, 5), "env"),
         Section((3000,), 1, (6,), "env"),
         Section((300,), 3, (1, 2, 3, 4, 5), "server"))


def measure_section(section: Section, judge_concurrency: int) -> list[dict[str, Any]]:
    with prefect_server() if section.api == "server" else nullcontext() as url:
        return run(list(section.sizes), section.reps, set(section.scenarios),
                   judge_concurrency, api_url=url)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--suite", action="store_true",
                        help="run every table bench/RESULTS.md publishes (about 20 minutes; "
                             "--sizes, --reps, --scenarios and --api are then ignored)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[30])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--scenarios", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--judge-concurrency", type=int, default=16,
                        help="evalsnap's judge rate limit (requests in flight per process)")
    parser.add_argument("--api", choices=["env", "server"], default="env",
                        help="evalsnap's Prefect API: as the environment says (no "
                             "PREFECT_API_URL: the temporary API each run starts), or a "
                             "`prefect server` the runner starts on 127.0.0.1 and stops")
    parser.add_argument("--out", default=None,
                        help="the file whose generated block the tables replace (default: "
                             "bench/RESULTS.md with --suite; else the tables are only printed)")
    args = parser.parse_args()
    started = time.time()
    plan = SUITE if args.suite else (Section(tuple(args.sizes), args.reps,
                                             tuple(args.scenarios), args.api),)
    sections = [(section, measure_section(section, args.judge_concurrency))
                for section in plan]
    text = render(sections, args, started)
    out = args.out or (str(ROOT / "bench" / "RESULTS.md") if args.suite else None)
    if out:  # a partial run never replaces the suite's published tables by itself
        Path(out).write_text(merge(Path(out), text))
    print(text)


BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def merge(out: Path, generated: str) -> str:
    """The output file with its generated block replaced; text around it (the reading of
    the numbers) is kept. A file without the markers is replaced whole, under a title."""
    block = f"{BEGIN}\n{generated}{END}\n"
    old = out.read_text() if out.exists() else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1].lstrip("\n")
    return f"# Benchmark results\n\n{block}"


if __name__ == "__main__":
    main()
