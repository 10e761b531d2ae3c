"""Issue 29 item 1: gc must not delete what a run that starts while gc runs names.

Run A scores three metrics, run B only one (same cases, same agent): with ``--keep-last 1``
A goes, and with it A's snapshot and the units of the two metrics B did not score. Run C
(A's config, ``--reuse``) makes exactly those again, byte for byte (objects hold no run id or
time), or reuses them through the index. gc (a process of its own) starts, and once it has
removed A's manifest (it read ``v1/STORE`` long before), its index entries and cached
results, it is held where it sweeps the store's old temporary files, before any object
(:mod:`tests._gc_hold`: a slow gc, made deterministic), while C runs from start to
end; then gc goes on. Afterwards ``verify`` is clean, ``show latest`` is C's run, and a
later quiet gc still leaves a whole store. Local disk (ages set with ``os.utime``, the
default grace period) and moto S3 (no way to backdate there, so ``--grace 0``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._cli import run_inproc
from tests.conftest import ROOT
from tests.servers import Server, moto_with_bucket

CASES = ["weather_paris", "cart_add_two_items", "cart_add_then_show"]
PLUGINS = ["shop_agent.offline_models"]
CONFIG_A = {"evalsnapPlugins": PLUGINS,
            "criteria": {"tool_trajectory_avg_score": 1.0, "response_match_score": 0.5,
                         "final_response_match_v2": {"threshold": 0.5, "judgeModelOptions": {
                             "judgeModel": "offline-judge-v1", "numSamples": 1}}}}
CONFIG_B = {"evalsnapPlugins": PLUGINS, "criteria": {"tool_trajectory_avg_score": 1.0}}
BUCKET = "evalsnap-faults3"
#: Old temporary files of interrupted writes: gc sweeps them after the index entries and
#: cached results, before any object, and is held there (:mod:`tests._gc_hold`).
LITTER = 3
_S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


@pytest.fixture(scope="module")
def moto() -> Iterator[Server]:
    with moto_with_bucket(BUCKET) as server:
        yield server


class _Local:
    def __init__(self, root: Path) -> None:
        self.url, self.root = str(root), root

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def age(self) -> None:
        """Everything two hours older: beyond the default grace period of one hour, in the
        order it was written (gc finds a set's newest run by the store's dates, and two runs
        of one second given the same date would be ordered by their ids' random part)."""
        for path in self.root.rglob("*"):
            st = path.lstat()
            os.utime(path, ns=(st.st_atime_ns - 7200 * 10**9, st.st_mtime_ns - 7200 * 10**9),
                     follow_symlinks=False)

    def litter(self, n: int) -> None:
        for i in range(n):
            folder = self.root / "v1" / "objects" / "record" / f"{i % 256:02x}"
            if i < 256:
                folder.mkdir(parents=True, exist_ok=True)
            (folder / f".tmp-litter-{i}").touch()


class _S3:
    def __init__(self, url: str, endpoint: str) -> None:
        import fsspec

        self.url = url
        self.fs = fsspec.filesystem("s3", endpoint_url=endpoint, key="testing", secret="testing",
                                    use_listings_cache=False, skip_instance_cache=True)

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(f"{self.url.removeprefix('s3://')}/{rel}"))

    def age(self) -> None:
        pass  # S3 keeps its own dates: the gc runs with --grace 0

    def litter(self, n: int) -> None:
        base = self.url.removeprefix("s3://")
        self.fs.pipe({f"{base}/v1/objects/record/{i % 256:02x}/.tmp-litter-{i}": b""
                      for i in range(n)})


def _popen_held(hold: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``evalsnap ARGS`` in a process, held before it sweeps temporary files until
    ``hold/go`` exists (it writes ``hold/held`` then)."""
    hold.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "tests._gc_hold", str(hold), *args],
                            cwd=ROOT,
                            env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _await(what: str, done: Callable[[], bool], alive: subprocess.Popen[str],
           timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert alive.poll() is None, f"ended before {what}: {alive.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.05)


def _json(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    stdout, stderr = proc.communicate(timeout=900)
    lines = [line for line in stdout.splitlines() if line.strip()]
    return proc.returncode, json.loads(lines[-1]) if lines else {}, stderr


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_gc_and_a_run_that_starts_meanwhile(backend: str, shop_copy: Path, tmp_path: Path,
                                            request: pytest.FixtureRequest,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    env: dict[str, str] = {}
    store: _Local | _S3
    if backend == "s3":
        server = request.getfixturevalue("moto")
        env = {**_S3_ENV, "AWS_ENDPOINT_URL": server.url}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        store = _S3(f"s3://{BUCKET}/race-{uuid.uuid4().hex[:8]}", server.url)
        grace = ["--grace", "0"]
    else:
        store = _Local(tmp_path / "store")
        grace = []  # the default, 1h
    (shop_copy / "test_config.json").write_text(json.dumps(CONFIG_A))
    (tmp_path / "only_trajectory.json").write_text(json.dumps(CONFIG_B))
    evalset = str(shop_copy / "shop.evalset.json")
    cases = [a for c in CASES for a in ("--case", c)]

    def run(*extra: str) -> dict[str, Any]:
        result = run_inproc("run", str(shop_copy), evalset, "--store", store.url, "--json",
                            *cases, *extra, env=env)
        assert result.code in (0, 1), result.stderr[-3000:]
        return result.json

    run_a = run()
    run("--config", str(tmp_path / "only_trajectory.json"))  # B: newest, kept
    store.litter(LITTER)
    store.age()

    # gc in a process of its own, held (a slow gc, made deterministic) once it has removed
    # run A's manifest, index entries and cached results, before any object, while run C
    # runs from start to end in this process. The per-call store deadline
    # (EVALSNAP_STORE_TIMEOUT) stays long, as when the hold was a SIGSTOP.
    hold = tmp_path / "hold"
    gc = _popen_held(hold, "gc", "--store", store.url, "--keep-last", "1", *grace, "--json",
                     env={**env, "EVALSNAP_STORE_TIMEOUT": "900"})
    try:
        _await("gc holding before it sweeps temporary files", (hold / "held").exists, gc)
        assert not store.exists(f"v1/refs/runs/{run_a['run_id']}"), "A's manifest is still there"
        try:
            assert gc.poll() is None, "gc ended before run C started"
            result_c = run_inproc("run", str(shop_copy), evalset, "--store", store.url,
                                  "--json", "--reuse", *cases, env=env)
            c_code, body_c, c_err = result_c.code, result_c.json, result_c.stderr
            c_done = time.time()  # C wrote v1/STORE before this
        finally:
            (hold / "go").touch()
        gc_code, report, gc_err = _json(gc)
    finally:
        if gc.poll() is None:
            gc.kill()
            gc.wait(10)
    assert gc_code == 0, gc_err[-3000:]
    assert c_code in (0, 1), c_err[-3000:]

    def whole() -> None:
        verify = run_inproc("verify", "--store", store.url, "--json", env=env)
        assert verify.code == 0, verify.stdout[-3000:] + verify.stderr[-2000:]
        shown = run_inproc("show", "latest", "--store", store.url, "--json", env=env)
        assert shown.code == 0, shown.stderr[-3000:]
        assert shown.json["record_id"] == body_c["record_id"]
        assert {c["eval_id"] for c in shown.json["cases"]} == set(CASES)
        assert "raw_response" in json.dumps(shown.json), "judge ledger entries not resolved"

    whole()
    assert [r["run_id"] for r in report["runs_removed"]] == [run_a["run_id"]]
    assert report["kinds"]["temporary file"]["removed"] == LITTER, report["kinds"]
    assert report["objects_deferred"] and "started while gc ran" in report["objects_deferred"], \
        report
    # later, when no run writes: what gc deferred goes, and the store stays whole
    # (gc takes a writer that started within 2 s of it as one that may still write,
    # evalsnap.records.gc._STEP: C ended in this process just before)
    time.sleep(max(0.0, c_done + 2.5 - time.time()))
    later = run_inproc("gc", "--store", store.url, "--keep-last", "1", "--grace", "0", "--json",
                       env=env)
    assert later.code == 0, later.stderr[-3000:]
    assert later.json["objects_deferred"] is None and later.json["removed_count"] > 0
    assert [r["run_id"] for r in later.json["runs_kept"]] == [body_c["run_id"]]
    whole()
