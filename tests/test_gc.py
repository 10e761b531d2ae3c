"""Issue 19 item 6: ``evalsnap gc`` — retention that never loses what a kept or running run names.

Real runs of the demo agent (through the real CLI in the test process, :mod:`tests._cli`;
processes of their own where a run must be in flight while gc runs), gc through the real CLI, on local
disk, S3 (moto) and GCS (fake-gcs-server); ``verify`` and ``show`` judge what is left.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from typer.testing import CliRunner

from tests._cli import run_inproc
from tests.conftest import ROOT, copy_shop
from tests.servers import Server, fake_gcs_with_bucket, moto_with_bucket

CASES_A = ["weather_paris", "cart_add_two_items", "cart_add_then_show"]
CASES_NEW = ["weather_two_cities", "cart_add_to_prefilled", "cart_show_prefilled",
             "greeting_then_weather"]
CONFIG = {"evalsnapPlugins": ["shop_agent.offline_models"],
          "criteria": {"tool_trajectory_avg_score": 1.0, "response_match_score": 0.5,
                       "final_response_match_v2": {"threshold": 0.5, "judgeModelOptions": {
                           "judgeModel": "offline-judge-v1", "numSamples": 1}}}}
BUCKET = "evalsnap-gc"
_S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("gc")
    dst = copy_shop(base / "shop_agent")
    (dst / "test_config.json").write_text(json.dumps(CONFIG))
    # A second eval set of the same agent: keep-last counts per eval set.
    other = json.loads((dst / "shop.evalset.json").read_text())
    other["eval_set_id"], other["name"] = "shop_nightly2", "shop_nightly2"
    (dst / "shop_nightly2.evalset.json").write_text(json.dumps(other))
    return dst


def _run(agent: Path, store: str, cases: list[str], *extra: str, evalset: str = "shop",
         env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run_inproc("run", str(agent), str(agent / f"{evalset}.evalset.json"), "--store", store,
                     "--json", *[a for c in cases for a in ("--case", c)], *extra, env=env)
    assert result.code in (0, 1), result.stderr[-3000:]
    return result.json


def _gc(store: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run_inproc("gc", "--store", store, "--json", *args, env=env)
    assert result.code == 0, result.stderr[-3000:]
    return result.json


def _verify(store: str, env: dict[str, str] | None = None) -> None:
    result = run_inproc("verify", "--store", store, "--json", env=env)
    assert result.code == 0, result.stdout[-3000:] + result.stderr[-2000:]


def _shown_fully(store: str, run_id: str, cases: list[str], env: dict[str, str] | None = None) -> None:
    """``show RUN --json`` resolves every case, unit and judge ledger entry of the run."""
    shown = run_inproc("show", run_id, "--store", store, "--json", env=env)
    assert shown.code == 0, shown.stderr[-3000:]
    body = shown.json
    assert {c["eval_id"] for c in body["cases"]} == set(cases)
    text = json.dumps(body)
    assert "raw_response" in text, "the judge ledger entries were not resolved"


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _backdate(root: Path, seconds: float) -> None:
    """Every file under ``root`` written ``seconds`` earlier than it was (gc goes by mtime on
    disk), in the order it was written: gc finds a set's newest run by those dates, and two
    runs of one second given the same date would be ordered by their ids' random part."""
    shift = int(seconds * 10**9)
    for path in root.rglob("*"):
        if path.is_file():
            st = path.lstat()
            os.utime(path, ns=(st.st_atime_ns - shift, st.st_mtime_ns - shift),
                     follow_symlinks=False)


# ---- local disk ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_sets(agent: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three runs of eval set shop (two full-config subsets of cases), two of shop_nightly2."""
    store = str(tmp_path_factory.mktemp("two-sets") / "store")
    runs = {"shop": [], "shop_nightly2": []}
    for evalset, cases in (("shop", CASES_A), ("shop_nightly2", CASES_A[:1]),
                           ("shop", CASES_A[:2]), ("shop_nightly2", CASES_A[:1]),
                           ("shop", CASES_A[:1])):
        runs[evalset].append(_run(agent, store, cases, evalset=evalset))
        if len(runs["shop"]) == 1 and evalset == "shop":
            # --older-than between the first two runs of shop: the first was written two
            # hours ago (the store's dates: gc goes by them, not by what a manifest claims)
            _backdate(Path(store), 7200)
    # a copy before any test's gc: run A (shop, 3 cases, two hours old), B1 and B2 of
    # :func:`test_gc_while_a_run_writes_loses_nothing` (and two runs of shop_nightly2)
    pristine = str(Path(store).parent / "pristine")
    shutil.copytree(store, pristine)  # dates kept
    return {"store": store, "runs": runs, "pristine": pristine}


def test_dry_run_lists_what_would_go_and_deletes_nothing(two_sets: dict[str, Any]) -> None:
    store = two_sets["store"]
    before = _tree(Path(store))
    report = _gc(store, "--keep-last", "1", "--grace", "0", "--dry-run")
    assert report["dry_run"] is True
    assert {r["run_id"] for r in report["runs_removed"]} == {
        two_sets["runs"]["shop"][0]["run_id"], two_sets["runs"]["shop"][1]["run_id"],
        two_sets["runs"]["shop_nightly2"][0]["run_id"]}
    assert report["removed_count"] == len(report["removed"]) > 0
    assert report["removed_bytes"] == sum(k["bytes"] for k in report["kinds"].values()) > 0
    assert report["kinds"]["run"]["removed"] == 3 and report["kinds"]["record"]["removed"] == 3
    assert all(u.startswith(store) for u in report["removed"])
    assert _tree(Path(store)) == before
    table = run_inproc("gc", "--store", store, "--keep-last", "1", "--grace", "0", "--dry-run")
    assert table.code == 0 and "would remove" in table.stdout, table.stderr[-2000:]
    for run in report["runs_kept"]:  # the table says why each run stays, as --json does
        assert f"kept run {run['run_id']} ({run['eval_set_id']}): {run['why']}" in table.stdout
    # with the default grace period (1 h) the runs written within it stay; the table says so
    young = run_inproc("gc", "--store", store, "--keep-last", "1", "--dry-run")
    assert young.code == 0, young.stderr[-2000:]
    assert ": written within the grace period" in young.stdout, young.stdout
    assert _tree(Path(store)) == before


def test_older_than_removes_only_runs_older_than_that(two_sets: dict[str, Any]) -> None:
    store = two_sets["store"]
    shop = two_sets["runs"]["shop"]
    manifests = Path(store, "v1", "refs", "runs")
    ages = [time.time() - (manifests / run["run_id"]).stat().st_mtime for run in shop[:2]]
    assert ages[0] > 7000 and ages[1] < 1800, ages  # the fixture backdates the first run
    # what the first run's manifest claims of itself is recent: gc must not go by it
    created = dt.datetime.fromisoformat(run_inproc("show", shop[0]["run_id"], "--store", store,
                                                   "--json").json["record"]["created_at"]
                                        .replace("Z", "+00:00")).timestamp()
    assert time.time() - created < 1800, created
    # one hour: younger than the first run (two hours old by the store), older than the second
    report = _gc(store, "--older-than", f"{1 / 24:.8f}", "--grace", "0", "--dry-run")
    assert [r["run_id"] for r in report["runs_removed"]] == [shop[0]["run_id"]]
    kept = {r["run_id"]: r["why"] for r in report["runs_kept"]}
    assert kept[shop[1]["run_id"]].startswith("younger than")


def test_keep_last_counts_per_eval_set_and_verify_passes(two_sets: dict[str, Any]) -> None:
    store = two_sets["store"]
    # every writing command rewrites v1/STORE as it starts (gc does not),
    # and gc sweeps index entries and objects only once the latest writer is not recent
    # (evalsnap.records.gc._STEP, 2 s): as if that long had passed since the last one
    marker = Path(store) / "v1" / "STORE"
    old = time.time() - 3
    os.utime(marker, (old, old))
    report = _gc(store, "--keep-last", "1", "--grace", "0")
    assert report["dry_run"] is False and report["removed_count"] > 0
    assert report["objects_deferred"] is None, report["objects_deferred"]
    root = Path(store) / "v1" / "refs" / "runs"
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [two_sets["runs"]["shop"][-1]["run_id"], two_sets["runs"]["shop_nightly2"][-1]["run_id"]])
    _verify(store)
    for evalset in ("shop", "shop_nightly2"):
        newest = two_sets["runs"][evalset][-1]
        _shown_fully(store, newest["run_id"], [c["eval_id"] for c in newest["cases"]])
    for gone in report["runs_removed"]:
        assert run_inproc("show", gone["run_id"], "--store", store).code == 2
        assert not list((Path(store) / "v1").rglob(f"*{gone['record_id'].split(':')[1]}*.html"))
    os.utime(marker, (old, old))  # the gc above was a writer too
    again = _gc(store, "--keep-last", "1", "--grace", "0")
    assert again["removed_count"] == 0, again["removed"]


@pytest.fixture(scope="module")
def moto() -> Iterator[Server]:
    with moto_with_bucket(BUCKET) as server:
        yield server


def _s3_env(moto: Server) -> dict[str, str]:
    return {**_S3_ENV, "AWS_ENDPOINT_URL": moto.url}


@pytest.fixture(scope="module")
def abb(two_sets: dict[str, Any], agent: Path, moto: Server) -> dict[str, dict[str, Any]]:
    """Run A (3 cases), then B1 and B2 of eval set shop, on local disk and on S3, once for
    the module. On disk: a copy of :func:`two_sets` before any gc (A is backdated two hours
    there: gc goes by mtime; B1 has 2 cases, and two runs of shop_nightly2 are in between).
    S3 keeps its own dates: A, B1 and B2 (1 case each) are run there, and the store notes
    when A was written; the S3 test waits, if it must, until A is older than its grace
    period (the tests in between age it: this fixture is first used before them)."""
    s3_env = _s3_env(moto)
    s3_store = f"s3://{BUCKET}/gc-{uuid.uuid4().hex[:8]}"
    s3 = {"store": s3_store, "env": s3_env, "a": _run(agent, s3_store, CASES_A, env=s3_env),
          "a_written": time.monotonic()}
    _run(agent, s3_store, CASES_A[:1], env=s3_env)  # B1
    s3["b"] = _run(agent, s3_store, CASES_A[:1], env=s3_env)
    shop = two_sets["runs"]["shop"]
    assert [len(r["cases"]) for r in shop] == [3, 2, 1], shop
    local = {"store": two_sets["pristine"], "env": {}, "a": shop[0], "b": shop[-1]}
    return {"local": local, "s3": s3}


def test_a_killed_run_is_collected_only_after_the_grace_period(
        agent: Path, abb: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    shutil.copytree(abb["local"]["store"], store)  # three runs of shop, two of shop_nightly2
    before = _tree(Path(store))
    env = {**os.environ, "EVALSNAP_DEMO_LATENCY_MS": "300"}
    proc = subprocess.Popen([sys.executable, "-m", "evalsnap.cli", "run", str(agent),
                             str(agent / "shop.evalset.json"), "--store", store, "--json",
                             *[a for c in CASES_NEW for a in ("--case", c)]],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not any(
                "/objects/" in p and "/.tmp-" not in p
                for p in set(_tree(Path(store))) - set(before)):
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it was killed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    orphans = set(_tree(Path(store))) - set(before)
    assert any("/objects/" in p for p in orphans), orphans
    # --keep-last 3: A, B1 and B2 stay; only what the killed run left may go
    kept = _gc(store, "--keep-last", "3", "--grace", "1h")
    assert kept["removed_count"] == 0, kept["removed"]
    assert orphans <= set(_tree(Path(store)))
    # gc sweeps only once the latest writer (here the killed run, which rewrote v1/STORE as
    # it started) is not recent (evalsnap.records.gc._STEP, 2 s; a fast machine gets here
    # sooner): as if that long had passed since it started
    old = time.time() - 3
    os.utime(Path(store) / "v1" / "STORE", (old, old))
    swept = _gc(store, "--keep-last", "3", "--grace", "0")
    assert swept["removed_count"] > 0 and not swept["runs_removed"], swept
    assert not {p for p in orphans if "/objects/" in p} & set(_tree(Path(store)))
    _verify(store)


# ---- a run writing while gc runs, on local disk and on S3 -------------------------------------

#: The grace period of the test below, per backend: on disk A is two hours old (backdated)
#: and the default applies; on S3 (no way to backdate) it must be longer than run C and
#: shorter than A's age, for which the test waits.
GRACE = {"local": 3600, "s3": 40}


def _objects(store: str, env: dict[str, str]) -> set[str]:
    if store.startswith("s3://"):
        fs = fsspec.filesystem("s3", endpoint_url=env["AWS_ENDPOINT_URL"], key="testing",
                               secret="testing", use_listings_cache=False, skip_instance_cache=True)
        return {str(p) for p in fs.find(store.removeprefix("s3://") + "/v1/objects")}
    return {str(p) for p in Path(store, "v1", "objects").rglob("*") if p.is_file()}


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_gc_while_a_run_writes_loses_nothing(backend: str, agent: Path, tmp_path: Path,
                                             abb: dict[str, dict[str, Any]],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A (3 cases), then B1 and B2 (fewer cases; :func:`abb`): with --keep-last 2 only B1 and
    B2 of their eval set are kept.
    C reuses A's work for A's cases (the index still names it) and runs 4 new ones slowly,
    while gc runs again and again with a grace period longer than C but shorter than A's
    age: A's run goes at once, but no object C took from A's run may go before C names it,
    and nothing of B2 (kept throughout) goes."""
    setup = abb[backend]
    env: dict[str, str] = setup["env"]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    grace = GRACE[backend]
    if backend == "s3":
        store = setup["store"]
        # A is older than the grace period
        time.sleep(max(0.0, grace + 2 - (time.monotonic() - setup["a_written"])))
    else:
        store = str(tmp_path / "store")
        shutil.copytree(setup["store"], store)  # dates kept: A two hours old
        age = time.time() - Path(store, "v1", "refs", "runs", setup["a"]["run_id"]).stat().st_mtime
        assert age > grace + 60, age
    run_a, run_b = setup["a"], setup["b"]
    before = _objects(store, env)
    slow = {**os.environ, **env, "EVALSNAP_INFER_BATCH": "50",
            "EVALSNAP_DEMO_AGENT_LATENCY_MS": "1200",
            "EVALSNAP_DEMO_JUDGE_LATENCY_MS": "800"}
    proc = subprocess.Popen([sys.executable, "-m", "evalsnap.cli", "run", str(agent),
                             str(agent / "shop.evalset.json"), "--store", store, "--json",
                             "--reuse", *[a for c in CASES_A + CASES_NEW for a in ("--case", c)]],
                            cwd=ROOT, env=slow, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    from evalsnap.cli import app

    reports = []
    try:
        # C has looked its reusable work up once its first new object exists.
        while proc.poll() is None and not (_objects(store, env) - before):
            time.sleep(0.1)
        c_started = time.monotonic()
        while proc.poll() is None:
            result = CliRunner().invoke(app, ["gc", "--store", store, "--keep-last", "2",
                                              "--grace", f"{grace}s", "--json"])
            assert result.exit_code == 0, result.output[-3000:]
            reports.append(json.loads(result.stdout.strip().splitlines()[-1]))
        stdout, stderr = proc.communicate(timeout=60)
        c_took = time.monotonic() - c_started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode in (0, 1), stderr[-3000:]
    assert c_took < grace, f"run C must be shorter than the grace period: {c_took:.1f} s"
    run_c = json.loads(stdout.strip().splitlines()[-1])
    assert run_c["reused_units"] > 0 and len(reports) >= 2, (run_c["reused_units"], len(reports))
    assert reports[0]["runs_removed"] and reports[0]["runs_removed"][0]["run_id"] == run_a["run_id"]
    for report in reports:
        assert report["objects_deferred"], report
        assert all(report["kinds"][k]["removed"] == 0
                   for k in ("record", "snapshot", "inference", "unit", "judge", "index/inference",
                             "index/unit", "index/judge", "prefect result")), report
    _verify(store, env)
    # (that every case of C and B resolves is shown after the quiet gc below: a gc writes
    # no object (only tombstones), so what the race had lost would be missing there too)
    # Quiet now: a gc without a grace period sweeps what nothing kept names, and nothing else.
    final = _gc(store, "--keep-last", "2", "--grace", "0", env=env)
    assert final["objects_deferred"] is None and final["removed_count"] > 0
    assert [r["run_id"] for r in final["runs_kept"] if r["eval_set_id"] == "shop"] == [
        run_c["run_id"], run_b["run_id"]]
    _verify(store, env)
    _shown_fully(store, run_c["run_id"], CASES_A + CASES_NEW, env)
    _shown_fully(store, run_b["run_id"], CASES_A[:1], env)
    again = _run(agent, store, CASES_A + CASES_NEW, "--reuse", env=env)
    assert again["agent_calls"] == 0 and again["judge_calls"] == 0
    assert again["reused_units"] >= run_c["reused_units"]


# ---- GCS ----------------------------------------------------------------------------------

def test_gcs_smoke(agent: Path) -> None:
    with fake_gcs_with_bucket(BUCKET) as server:
        env = {"STORAGE_EMULATOR_HOST": server.url, "NO_GCE_CHECK": "true",
               "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}
        store = f"gs://{BUCKET}/gc-{uuid.uuid4().hex[:8]}"
        first = _run(agent, store, CASES_A[:2], env=env)
        second = _run(agent, store, CASES_A[:1], env=env)
        # gc defers objects while the newest writer's marker (v1/STORE) is under 2 s old
        # (buckets date objects to the second): a quick second run would make the real gc
        # below defer what the dry run counts, so both start once that window has passed
        time.sleep(2.1)
        dry = _gc(store, "--keep-last", "1", "--grace", "0", "--dry-run", env=env)
        assert [r["run_id"] for r in dry["runs_removed"]] == [first["run_id"]]
        report = _gc(store, "--keep-last", "1", "--grace", "0", env=env)
        assert report["removed_count"] == dry["removed_count"] > 0
        assert report["kinds"]["record"]["removed"] == 1
        _verify(store, env)
        _shown_fully(store, second["run_id"], CASES_A[:1], env)
        assert _gc(store, "--keep-last", "1", "--grace", "0", env=env)["removed_count"] == 0


# ---- usage and the flow -------------------------------------------------------------------

def test_usage_errors_exit_2(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    assert run_inproc("gc", "--store", store).code == 2
    assert run_inproc("gc", "--store", store, "--keep-last", "0").code == 2
    bad = run_inproc("gc", "--store", store, "--keep-last", "1", "--grace", "soon")
    assert bad.code == 2 and "grace" in bad.stderr


def test_the_gc_flow_of_the_deployment(two_sets: dict[str, Any]) -> None:
    from flows.gc import gc

    report = gc(store=two_sets["store"], keep_last=1, grace="0", dry_run=True)
    assert report["dry_run"] is True and "removed" not in report
    assert {r["eval_set_id"] for r in report["runs_kept"]} == {"shop", "shop_nightly2"}
