"""What a bucket costs: the same runs on local disk, on moto S3 and on fake-gcs-server.

    python -m bench.stores [--cases 210] [--latency 0 20] [--backends local s3 gcs]
                           [--reps 1] [--kept 1] [--out bench/STORES.md]

Per backend and injected latency (a proxy of the bench's own, :mod:`bench._proxy`, waits
that long before each request and counts them), a cold ``evalsnap run`` and then a no-op
``evalsnap run --reuse`` (0 model calls) of ``--cases`` generated cases × 5 metrics, whole
processes against one ``prefect server`` the bench starts. Printed: wall time, the ratio to
the same run on local disk, the store requests evalsnap counted (``store_requests``), the
requests the proxy saw, for a cold run the objects it left and the requests per object, and
the peak RSS of the run's largest process. With ``--kept K``, K no-op reruns follow the cold
run and the last is reported too: what a no-op costs once the store keeps K+1 runs of the
eval set (a nightly's store after K nights).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # before gcsfs is imported
import shutil
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.__main__ import evalsnap_cmd, make_agent, measure, prefect_server
from bench._proxy import LatencyProxy

ROOT = Path(__file__).resolve().parent.parent
#: Five metrics: two code metrics, two judge metrics, the state metric.
CONFIG = {
    "evalsnapPlugins": ["shop_agent.offline_models"],
    "criteria": {
        "tool_trajectory_avg_score": 1.0,
        "response_match_score": 0.5,
        "final_response_match_v2": {"threshold": 0.5, "judgeModelOptions": {
            "judgeModel": "offline-judge-v1", "numSamples": 3}},
        "hallucinations_v1": {"threshold": 0.5, "judgeModelOptions": {
            "judgeModel": "offline-judge-v1"}},
        "final_state_match": 1.0,
    },
}


def _servers(stack: ExitStack, backends: list[str]) -> dict[str, Any]:
    import sys

    sys.path.insert(0, str(ROOT))
    from tests import servers

    out: dict[str, Any] = {}
    if "s3" in backends:
        moto = servers.start_moto()
        stack.callback(moto.stop)
        servers.s3_create_bucket(moto, "bench")
        out["s3"] = moto
    if "gcs" in backends:
        gcs = servers.start_fake_gcs()
        stack.callback(gcs.stop)
        servers.gcs_create_bucket(gcs, "bench")
        out["gcs"] = gcs
    return out


def _objects_in(store: str, env: dict[str, str]) -> int:
    """Files the run left in the store (listed directly, not through the proxy)."""
    if "://" not in store:
        return sum(1 for f in Path(store).rglob("*") if f.is_file())
    import fsspec

    protocol = store.split("://", 1)[0]
    opts: dict[str, Any] = {}
    if protocol == "s3":
        opts = {"endpoint_url": env["BENCH_DIRECT_ENDPOINT"], "key": "x", "secret": "x"}
    else:
        opts = {"endpoint_url": env["BENCH_DIRECT_ENDPOINT"], "token": "anon"}
    fs = fsspec.filesystem(protocol, skip_instance_cache=True, **opts)
    return len(fs.find(store.split("://", 1)[1]))


def run(cases: int, latencies: list[float], backends: list[str],
        reps: int, src: str = "", kept: int = 1) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="evalsnap-bench-stores-"))
    agent, evalset = make_agent(work, cases)
    (agent / "test_config.json").write_text(json.dumps(CONFIG))
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    base.update(EVALSNAP_DEMO_LATENCY_MS="0", EVALSNAP_JUDGE_CONCURRENCY="16",
                AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                AWS_DEFAULT_REGION="us-east-1", GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")
    if src:  # another checkout's evalsnap (a `git worktree` of an earlier commit): the before
        base["PYTHONPATH"] = src
    with ExitStack() as stack:
        base["PREFECT_API_URL"] = stack.enter_context(prefect_server())
        emulators = _servers(stack, backends)
        for latency in latencies:
            for backend in backends:
                for _ in range(reps):
                    rows += _pair(work, agent, evalset, backend, latency, base, emulators,
                                  kept)
    shutil.rmtree(work, ignore_errors=True)
    return rows


def _pair(work: Path, agent: Path, evalset: Path, backend: str, latency: float,
          base: dict[str, str], emulators: dict[str, Any],
          kept: int = 1) -> list[dict[str, Any]]:
    env = dict(base)
    tag = uuid.uuid4().hex[:8]
    proxy: LatencyProxy | None = None
    with ExitStack() as stack:
        if backend == "local":
            store = str(work / f"store-{tag}")
        else:
            server = emulators[backend]
            proxy = stack.enter_context(LatencyProxy(server.url, latency))
            env["BENCH_DIRECT_ENDPOINT"] = server.url
            if backend == "s3":
                env["AWS_ENDPOINT_URL"] = proxy.url
                store = f"s3://bench/{tag}"
            else:
                env["STORAGE_EMULATOR_HOST"] = proxy.url
                store = f"gs://bench/{tag}"
        out = []
        runs = [("cold", []), ("no-op --reuse", ["--reuse"])]
        runs += [(f"no-op --reuse, {k + 1} runs kept", ["--reuse"]) for k in range(1, kept)]
        for i, (kind, extra) in enumerate(runs):
            if proxy is not None:
                proxy.reset()
            started = time.monotonic()
            cmd = evalsnap_cmd("run", str(agent), str(evalset), "--store", store, *extra)
            # another checkout's evalsnap runs from that checkout: `python -m` imports
            # from its working directory first, whatever PYTHONPATH says
            res = measure(cmd, env, Path(env["PYTHONPATH"]) if "PYTHONPATH" in env else None)
            wall = time.monotonic() - started
            if "run_id" not in res:  # the run failed: say why, once
                import subprocess

                err = subprocess.run(cmd[3:], env=env, capture_output=True, text=True).stderr
                raise RuntimeError(f"{backend} {kind} failed: {err[-3000:]}")
            seen = proxy.reset() if proxy is not None else None
            if proxy is not None and os.environ.get("BENCH_PATHS"):
                print(backend, kind, json.dumps(dict(sorted(proxy.last_paths.items()))),
                      flush=True)
            row = {"backend": backend, "latency_ms": latency if backend != "local" else 0,
                   "run": kind, "wall": wall, "agent_calls": res.get("agent_calls"),
                   "judge_calls": res.get("judge_calls"),
                   "store_requests": (res.get("store_requests") or {}).get("total"),
                   "proxy_requests": None if seen is None else seen["total"],
                   "rss_mb": res.get("rss_mb")}
            if kind == "cold":
                row["objects"] = _objects_in(store, env)
            if i < 2 or i == len(runs) - 1:  # cold, the first no-op, the last
                out.append(row)
        return out


def render(rows: list[dict[str, Any]], cases: int) -> str:
    local = {r["run"]: r["wall"] for r in rows if r["backend"] == "local"}
    lines = [f"{cases} cases × 5 metrics; one `prefect server`; walls are whole processes.", "",
             "| backend | latency ms | run | wall s | × local disk | store requests (evalsnap) "
             "| requests (proxy) | objects left | requests / object | agent, judge calls "
             "| peak RSS MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["wall"] / local[r["run"]] if r["run"] in local else float("nan")
        per = (f"{r['proxy_requests'] / r['objects']:.2f}" if r.get("objects")
               and r.get("proxy_requests") is not None else "")
        lines.append(f"| {r['backend']} | {r['latency_ms']:g} | {r['run']} | {r['wall']:.1f} | "
                     f"{ratio:.2f}× | {r['store_requests']} | {r['proxy_requests'] or ''} | "
                     f"{r.get('objects', '')} | {per} | {r['agent_calls']}, {r['judge_calls']} | "
                     f"{r['rss_mb']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.stores")
    parser.add_argument("--cases", type=int, default=210)
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0, 20.0])
    parser.add_argument("--backends", nargs="+", default=["local", "s3", "gcs"],
                        choices=["local", "s3", "gcs"])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--kept", type=int, default=1,
                        help="no-op reruns after the cold run (the last is reported too)")
    parser.add_argument("--out", default="")
    parser.add_argument("--evalsnap-src", default="",
                        help="run the evalsnap of this checkout instead (e.g. a `git worktree "
                             "add /tmp/old COMMIT`): the same runs before a change")
    args = parser.parse_args()
    rows = run(args.cases, args.latency, args.backends, args.reps, args.evalsnap_src,
               args.kept)
    text = render(rows, args.cases)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
