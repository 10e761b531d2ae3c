"""Issue 21, items 5 and 7: store reads never crash, and read-only use.

* Stored bytes that are wrong in any way (nested too deeply to parse, not UTF-8, the wrong
  types) planted as a manifest, a record or an index entry give typed errors (exit 2;
  ``verify`` exit 1) or count as absent (``latest``, ``--reuse``): never exit 3 with a
  ``RecursionError``. ``import-adk-history`` validates every file before importing any.
* ``ls``, ``show``, ``explain``, ``diff``, ``replay`` and ``verify`` work on a store that
  cannot be written (a read-only directory; as root, where permissions do not stop writes,
  a bucket role without ``s3:PutObject`` on moto); only commands that write need to write,
  and their hint fits the backend. An unknown ``--storage-option`` is exit 2 naming it.

Everything goes through the real CLI, in the test process (:mod:`tests._cli`). One cold run of one case builds a
local store; each test plants its damage in its own copy.
"""

from __future__ import annotations

import json
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evalsnap.records import EvaluationRecord, ManifestEntry, ScoreUnit, repo, segments
from storage import Store
from tests._cli import run_inproc
from tests.conftest import CliResult, copy_shop
from tests.servers import Server, start_moto
from tests.test_remote_stores import _env

CASE = "weather_paris"
#: Deeper than any JSON parser in Python can go (its recursion limit is ~1,000), and small
#: enough for an index entry (64 KiB): the nesting is what is wrong, not the size.
DEEP = b"[" * 30000 + b"]" * 30000
NEWEST_RUN = "20991231T235959Z-deep00"


def _run(agent: Path, store: str, *extra: str, env: dict[str, str] | None = None) -> CliResult:
    return run_inproc("run", str(agent), str(agent / "shop.evalset.json"), "--store", store,
                   "--case", CASE, "--json", *extra, env=env)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("store-faults")
    agent = copy_shop(root / "shop_agent")
    store = root / "store"
    cold = _run(agent, str(store))
    assert cold.code == 0, cold.stderr[-3000:]
    record = repo.get(Store(str(store)), EvaluationRecord, cold.json["record_id"])
    return {"root": root, "agent": agent, "store": store, "cold": cold.json, "record": record,
            "run_id": cold.json["run_id"], "exported": Path(cold.json["adk_history_path"])}


def _copy(base: dict[str, Any], name: str) -> Path:
    dst = base["root"] / f"store-{name}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(base["store"], dst)
    return dst


def _refs(store: Path, namespace: str) -> Path:
    return store / "v1" / "refs" / namespace


def _typed(result: CliResult, code: int = 2) -> None:
    """Exit ``code`` with a message, never a crash."""
    assert result.code == code, f"exit {result.code}\n{result.stderr[-3000:]}"
    for crash in ("RecursionError", "internal error", "Traceback"):
        assert crash not in result.stderr, result.stderr[-3000:]


# ---- item 5: stored bytes that do not parse ------------------------------------------------

def _newest_but_wrong() -> bytes:
    """A manifest `latest` tries first (the newest ``created_at``) that parses as JSON, but
    nests a list deeper than any manifest field."""
    deep_list = "[" * 500 + "]" * 500
    return (f'{{"created_at": "2099-12-31T23:59:59Z", "run_id": "{NEWEST_RUN}", '
            f'"objects": {deep_list}}}').encode()


def test_deep_manifest_is_a_typed_error_and_latest_skips_it(base: dict[str, Any]) -> None:
    store = _copy(base, "deep-manifest")
    deep_run = "20991231T235959Z-deep01"
    (_refs(store, "runs") / deep_run).write_bytes(DEEP)
    (_refs(store, "runs") / NEWEST_RUN).write_bytes(_newest_but_wrong())
    for command in ("show", "explain"):
        direct = run_inproc(command, deep_run, "--store", str(store))
        _typed(direct)
        assert f"runs/{deep_run}" in direct.stderr and "nested too deeply" in direct.stderr
        wrong = run_inproc(command, NEWEST_RUN, "--store", str(store))
        _typed(wrong)
        assert f"runs/{NEWEST_RUN}" in wrong.stderr and "does not match" in wrong.stderr
    latest = run_inproc("show", "latest", "--store", str(store), "--json")
    _typed(latest, 0)
    assert latest.json["record_id"] == base["cold"]["record_id"]  # the readable run
    _typed(run_inproc("explain", "latest", "--store", str(store)), 0)
    listed = run_inproc("ls", "--store", str(store), "--json")
    _typed(listed, 0)
    assert [r["run_id"] for r in listed.json["runs"]] == [base["run_id"]]
    verify = run_inproc("verify", "--store", str(store), "--json")
    _typed(verify, 1)
    problems = {p["run_id"]: p for p in verify.json["problems"]}
    assert set(problems) == {deep_run, NEWEST_RUN}
    assert problems[deep_run]["kind"] == "manifest"
    assert "nested too deeply" in problems[deep_run]["message"]
    warm = _run(base["agent"], str(store), "--reuse")
    _typed(warm, 0)
    assert warm.json["reused_units"] == len(base["record"].units)


def _plant_record(store: Path, base: dict[str, Any], data: bytes) -> str:
    """``data`` as a record object (hashing right) that the run's manifest and the eval set's
    latest-record index name."""
    s = Store(str(store))
    oid = s.put_object("record", data)
    manifest = repo.read_manifest(s, base["run_id"])
    objects = [ManifestEntry(kind="record", oid=oid) if e.kind == "record" else e
               for e in manifest.objects]
    repo.write_manifest(s, manifest.model_copy(update={"record_oid": oid, "objects": objects}))
    repo.set_latest_record(s, base["record"].eval_set_id, oid, base["run_id"])
    return oid


def test_deep_record_is_a_typed_error_everywhere(base: dict[str, Any]) -> None:
    store = _copy(base, "deep-record")
    oid = _plant_record(store, base, DEEP)
    for ref in (base["run_id"], "latest", oid):
        for command in ("show", "explain"):
            result = run_inproc(command, ref, "--store", str(store))
            _typed(result)
            assert f"record {oid}" in result.stderr and "nested too deeply" in result.stderr
    diffed = run_inproc("diff", "latest", base["cold"]["record_id"], "--store", str(store))
    _typed(diffed)
    verify = run_inproc("verify", "--store", str(store), "--json")
    _typed(verify, 1)
    found = {(p["kind"], p["oid"]) for p in verify.json["problems"]}
    assert ("record", oid) in found and ("manifest", oid) in found
    # the run after it cannot use the record as its parent, and says so; it is published
    warm = _run(base["agent"], str(store), "--reuse")
    _typed(warm, 0)
    assert warm.json["parent_record"] is None
    assert warm.json["reused_units"] == len(base["record"].units)


def _unit_entry(base: dict[str, Any], metric: str) -> str:
    [unit] = [u for u in base["record"].units if u.metric_name == metric]
    return repo.hexof(unit.unit_fingerprint)


BAD_ENTRIES = {
    "nested too deeply": DEEP,
    "not UTF-8": b'{"unit_oid": "\xff\xfe"}',
    "wrong types": json.dumps({"unit_oid": 7, "complete": "yes", "run_id": None,
                               "record_oid": ["x"]}).encode(),
    "an invalid id": json.dumps({"unit_oid": "../../../etc/passwd", "complete": True,
                                 "run_id": "r", "record_oid": "sha256:" + "0" * 64}).encode(),
}


#: One metric of the case per kind of bad entry: every kind is planted in one store, and
#: one --reuse run shows each counts as absent (the other metrics' entries are intact).
BAD_ENTRY_METRICS = dict(zip(sorted(BAD_ENTRIES), ["tool_trajectory_avg_score",
                                                   "response_match_score", "final_state_match",
                                                   "response_mentions_city"], strict=True))


def _as_earlier_layout(store: Path) -> None:
    """The store as an evalsnap before index segments wrote it: one ref per unit key
    (``index/unit/<hex>``), no segment; and no ``latest`` pointer, so that a rerun finds
    its units through the index alone (not through the previous record's hints)."""
    s = Store(str(store))
    for name in s.list_refs(segments.NAMESPACE):
        segment = segments.parse_segment(s.get_ref(segments.NAMESPACE, name) or b"", where=name)
        for key, oid, complete, run in segment.units:
            repo.write_index_entry(s, "index/unit", key, {
                "unit_oid": oid, "run_id": run, "complete": complete,
                "record_oid": segment.record_oid})
            # and its unit loose, as an evalsnap before packs wrote it
            s.put_object("unit", repo.find(s, ScoreUnit, oid).to_bytes())
        if segment.units:
            s.delete_ref(segments.NAMESPACE, name)
    shutil.rmtree(_refs(store, "index/evalset"))


def test_bad_unit_index_entries_count_as_absent(base: dict[str, Any]) -> None:
    """Per-key entries an earlier evalsnap wrote are still read: a sound one hands out its
    unit, a bad one counts as absent (its unit is scored again); a bad segment too."""
    store = _copy(base, "unit-index")
    _as_earlier_layout(store)
    names = {}
    for fault, metric in BAD_ENTRY_METRICS.items():
        names[metric] = _unit_entry(base, metric)
        (_refs(store, "index/unit") / names[metric]).write_bytes(BAD_ENTRIES[fault])
    (_refs(store, segments.NAMESPACE) / "units-bad").write_bytes(DEEP)
    verify = run_inproc("verify", "--store", str(store), "--json")
    _typed(verify, 1)
    problems = verify.json["problems"]
    assert len(problems) == len(BAD_ENTRIES) + 1, problems
    for fault, metric in BAD_ENTRY_METRICS.items():
        found = [p for p in problems if p["location"].endswith(f"index/unit/{names[metric]}")]
        assert len(found) == 1 and found[0]["kind"] == "index", (fault, problems)
    assert [p["kind"] for p in problems if p["location"].endswith("units-bad")] == ["index"]
    warm = _run(base["agent"], str(store), "--reuse")
    _typed(warm, 0)
    assert warm.json["agent_calls"] == 0 and warm.json["scored_units"] == len(BAD_ENTRIES)
    [case] = warm.json["cases"]
    rescored = {m for m, v in case["metrics"].items() if not v["reused"]}
    assert rescored == set(BAD_ENTRY_METRICS.values())
    for fault, metric in BAD_ENTRY_METRICS.items():
        assert case["metrics"][metric]["why"] == "new", fault
    # the rescored units are indexed again (a segment), so the next run reuses everything
    again = _run(base["agent"], str(store), "--reuse")
    _typed(again, 0)
    assert again.json["scored_units"] == 0


def test_deep_inference_index_entry_is_rebuilt_from_the_committed_record(
        base: dict[str, Any]) -> None:
    """A damaged entry counts as absent; the previous committed record names the inference,
    which hash-verifies, so it is reused and the entry rewritten (issue 29 item 12)."""
    store = _copy(base, "inference-index")
    [entry] = list(_refs(store, "index/inference").iterdir())
    entry.write_bytes(DEEP)
    shutil.rmtree(store / "v1" / "prefect")  # no task cache hit: the index is asked
    warm = _run(base["agent"], str(store), "--reuse")
    _typed(warm, 0)
    assert warm.json["agent_calls"] == 0
    [case] = warm.json["cases"]
    assert case["inference"] == "success" and case["inference_reused"]
    assert entry.read_bytes() != DEEP  # repaired
    _typed(run_inproc("verify", "--store", str(store)), 0)


def test_deep_judge_index_segments_ask_the_judge_again(base: dict[str, Any]) -> None:
    store = _copy(base, "judge-index")
    judge = [p for p in _refs(store, segments.NAMESPACE).iterdir() if p.name.startswith("judge-")]
    assert judge, "the cold run indexed no judge answer"
    for entry in judge:
        entry.write_bytes(DEEP)
    # no unit to reuse and no task cache hit: every judge metric looks its samples up
    for entry in _refs(store, segments.NAMESPACE).glob("units-*"):
        entry.unlink()
    shutil.rmtree(_refs(store, "index/evalset"))
    shutil.rmtree(store / "v1" / "prefect")
    warm = _run(base["agent"], str(store), "--reuse")
    _typed(warm, 0)
    assert warm.json["complete"] and warm.json["judge_calls"] == base["cold"]["judge_calls"]


def _history_dir(base: dict[str, Any], name: str) -> Path:
    """Two good ADK result files (distinct results) around the slot of a bad one."""
    directory = base["root"] / f"history-{name}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    raw = json.loads(base["exported"].read_bytes())
    for prefix in ("a", "c"):
        raw["eval_set_result_id"] = f"shop_agent_shop_{prefix}"
        raw["eval_set_result_name"] = f"shop_agent_shop_{prefix}"
        (directory / f"{prefix}_good.evalset_result.json").write_text(json.dumps(raw))
    return directory


BAD_HISTORY = {
    "nested too deeply": DEEP,
    "not UTF-8": b'{"eval_set_result_id": "\xff"}',
    "NaN": b'{"eval_set_result_id": "x", "eval_set_id": "s", "creation_timestamp": NaN}',
    "not an EvalSetResult": json.dumps({"eval_case_results": "none"}).encode(),
}


@pytest.mark.parametrize("fault", sorted(BAD_HISTORY))
def test_import_with_one_bad_file_imports_nothing(base: dict[str, Any], fault: str) -> None:
    directory = _history_dir(base, fault.replace(" ", "-"))
    bad = directory / "b_bad.evalset_result.json"
    bad.write_bytes(BAD_HISTORY[fault])
    store = base["root"] / f"imported-{fault.replace(' ', '-')}"
    result = run_inproc("import-adk-history", str(directory), "--store", str(store))
    _typed(result)
    assert str(bad) in result.stderr and "nothing was imported" in result.stderr
    listed = run_inproc("ls", "--store", str(store), "--json")
    _typed(listed, 0)
    assert listed.json["runs"] == []
    bad.unlink()  # the good files alone import
    good = run_inproc("import-adk-history", str(directory), "--store", str(store), "--json")
    _typed(good, 0)
    assert len(good.json["imported"]) == 2


# ---- item 7: read-only use -------------------------------------------------------------------

def _chmod_tree(root: Path, writable: bool) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        if writable:
            mode |= stat.S_IWUSR
        else:
            mode &= ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        path.chmod(mode)


def _permissions_stop_writes(directory: Path) -> bool:
    """False as root (or with CAP_DAC_OVERRIDE): a read-only mode does not stop writes."""
    probe = directory / ".write-probe"
    try:
        probe.write_bytes(b"")
    except PermissionError:
        return True
    probe.unlink()
    return False


def _reader_policy() -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": ["s3:Get*", "s3:List*", "s3:HeadBucket"],
        "Resource": "*"}]})


def _iam_user(iam: Any, name: str, policy: str) -> dict[str, str]:
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName=name, PolicyDocument=policy)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


@pytest.fixture(scope="module")
def moto_roles() -> Iterator[dict[str, Any]]:
    """moto checking credentials, with a bucket, a writer (s3:*) and a reader (get/list)."""
    import boto3

    server: Server = start_moto(unauthenticated_calls=3)  # the admin user's three calls below
    try:
        where = {"endpoint_url": server.url, "region_name": "us-east-1"}
        iam = boto3.client("iam", aws_access_key_id="testing", aws_secret_access_key="testing",
                           **where)
        admin = _iam_user(iam, "admin", json.dumps({"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        creds = {"aws_access_key_id": admin["AWS_ACCESS_KEY_ID"],
                 "aws_secret_access_key": admin["AWS_SECRET_ACCESS_KEY"]}
        iam = boto3.client("iam", **creds, **where)
        reader = _iam_user(iam, "reader", _reader_policy())
        boto3.client("s3", **creds, **where).create_bucket(Bucket="evalsnap-readonly")
        yield {"server": server, "writer": _env(AWS_ENDPOINT_URL=server.url, **admin),
               "reader": _env(AWS_ENDPOINT_URL=server.url, **reader)}
    finally:
        server.stop()


@pytest.fixture
def read_only(base: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A store holding one run, that the CLI below can read but not write: a local copy
    made read-only, or (where permissions do not stop writes) a bucket and a reader role."""
    store = _copy(base, "read-only")
    _chmod_tree(store, writable=False)
    try:
        if _permissions_stop_writes(store):
            yield {"url": str(store), "env": None, "writer_env": None, "refused": "permissions",
                   "run_id": base["run_id"]}
            return
        roles = request.getfixturevalue("moto_roles")
        prefix = f"ro-{uuid.uuid4().hex[:8]}"
        url = f"s3://evalsnap-readonly/{prefix}"
        # the one-run store, uploaded as is with the writer's role (a bucket store has the
        # local one's layout under its prefix): no second cold run
        writer = roles["writer"]
        import boto3

        client = boto3.client("s3", endpoint_url=roles["server"].url, region_name="us-east-1",
                              aws_access_key_id=writer["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=writer["AWS_SECRET_ACCESS_KEY"])
        for path in base["store"].rglob("*"):
            if path.is_file():
                client.put_object(Bucket="evalsnap-readonly", Body=path.read_bytes(),
                                  Key=f"{prefix}/{path.relative_to(base['store']).as_posix()}")
        yield {"url": url, "env": roles["reader"], "refused": "s3:PutObject",
               "run_id": base["run_id"]}
    finally:
        _chmod_tree(store, writable=True)


def test_reading_commands_work_without_write_access(read_only: dict[str, Any],
                                                    base: dict[str, Any]) -> None:
    url, env = read_only["url"], read_only["env"]
    listed = run_inproc("ls", "--store", url, "--json", env=env)
    _typed(listed, 0)
    assert [r["run_id"] for r in listed.json["runs"]] == [read_only["run_id"]]
    for command in (["show", "latest", "--json"], ["explain", "latest"],
                    ["diff", "latest", read_only["run_id"]], ["verify"]):
        _typed(run_inproc(*command, "--store", url, env=env), 0)
    replayed = run_inproc("replay", "latest", "--store", url, "--json", env=env)
    _typed(replayed, 0)
    # a command that writes says so, with the hint of this backend
    written = _run(base["agent"], url, env=env)
    _typed(written)
    assert read_only["refused"] in written.stderr
    if "://" not in url:
        assert "credentials" not in written.stderr


def test_local_store_failure_hints_at_the_path_not_at_credentials(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = run_inproc("ls", "--store", str(blocker / "store"))
    _typed(result)
    assert str(blocker / "store") in result.stderr and "path" in result.stderr
    assert "credentials" not in result.stderr and "endpoint" not in result.stderr


@pytest.mark.parametrize("url", ["s3://evalsnap-nowhere/p", "gs://evalsnap-nowhere/p", "LOCAL"])
def test_unknown_storage_option_is_exit_2_naming_it(url: str, tmp_path: Path) -> None:
    url = str(tmp_path / "store") if url == "LOCAL" else url
    result = run_inproc("ls", "--store", url, "--storage-option", "endpoint_ulr=http://x",
                     env=_env(AWS_ENDPOINT_URL="http://127.0.0.1:9"), timeout=60)
    _typed(result)
    assert "endpoint_ulr" in result.stderr and "use_listings_cache" in result.stderr
    assert "http://x" not in result.stderr  # values may be secrets: only the key is named
    if url.startswith("s3://"):
        assert "endpoint_url" in result.stderr  # what the backend takes


def test_unknown_storage_option_stops_a_run_before_any_work(base: dict[str, Any]) -> None:
    result = _run(base["agent"], "s3://evalsnap-nowhere/p", "--storage-option", "anonn=true",
                  env=_env(AWS_ENDPOINT_URL="http://127.0.0.1:9"))
    _typed(result)
    assert "'anonn'" in result.stderr and "takes" in result.stderr
