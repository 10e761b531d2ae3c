"""Issue 9: the bad-input catalogue. One file per case under ``tests/bad_inputs/``.

A case file is JSON::

    description    what is wrong with the input
    args           the command line after ``evalsnap``; placeholders {agent} {evalset}
                   {config} {store} {oid0} (oid of the first of ``store_objects``)
    evalset        an eval set (any JSON) written to a file; default: the demo eval set
    evalset_text   raw eval set text instead (for malformed JSON, NaN, escapes)
    evalset_depth  N: the eval set is N nested JSON lists
    config         a test_config (any JSON); default: response_match_score only (cheap)
    config_text    raw test_config text instead
    agent_files    {name: text} written into a private copy of the demo agent
    env            extra environment for the command
    store          a store URL instead of a fresh local directory
    needs          "moto": an S3 emulator must run (AWS_ENDPOINT_URL points at it)
    store_objects  [{kind, fixture, update}]: objects put into the store before the command
    store_refs     [{namespace, name, fixture, update}]: refs put there before the command
    expect         exit (exact), stderr / stdout (message fragments), statuses
                   ({"case/metric": status} from --json), inference ({case: status})

Every case runs the real CLI (``evalsnap.cli``'s app, its settings check and exit code) in
the test process, :func:`tests._cli.run_inproc`, as a new process would run it (fresh user
code, environment and working directory per call): a CLI process costs seconds of imports,
and none of these cases is about the process itself (the signal, exit and stdout-purity
contracts have their own subprocess tests in test_signals, test_cli_process and
test_hostile_code). A case that lets a ``BaseException`` (``KeyboardInterrupt``, a
``SystemExit`` other than the CLI's) out of the call fails its test instead of stopping the
session. After each case, the store holds no temporary file and every object in it
verifies: bad input never leaves a partial object behind.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from storage import Store
from tests._cli import run_inproc
from tests.conftest import EVALSET, ROOT, CliResult, copy_shop
from tests.servers import Server, start_moto

CASES_DIR = Path(__file__).parent / "bad_inputs"
CASE_FILES = sorted(CASES_DIR.glob("*.json"))
FIXTURES = Path(__file__).parent / "fixtures" / "records"
DEFAULT_CONFIG = {"criteria": {"response_match_score": 0.5}}
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
          "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
EXPECT_KEYS = {"exit", "stderr", "stdout", "statuses", "inference"}
CASE_KEYS = {"description", "args", "evalset", "evalset_text", "evalset_depth", "config",
             "config_text", "agent_files", "env", "store", "needs", "store_objects",
             "store_refs", "expect"}


def _load(path: Path) -> dict[str, Any]:
    case = json.loads(path.read_text(encoding="utf-8"))
    assert set(case) <= CASE_KEYS, f"{path.name}: unknown keys {set(case) - CASE_KEYS}"
    assert set(case["expect"]) <= EXPECT_KEYS, f"{path.name}: unknown expect keys"
    assert isinstance(case["expect"]["exit"], int), f"{path.name}: expect.exit must be exact"
    return case


def _fixture_bytes(spec: dict[str, Any]) -> bytes:
    body = json.loads((FIXTURES / spec["fixture"]).read_text())
    body.update(spec.get("update", {}))
    return json.dumps(body, sort_keys=True).encode()


class Prepared:
    """The files, store and environment of one case, and where to look afterwards."""

    def __init__(self, case: dict[str, Any], base: Path, moto: Server | None) -> None:
        self.base = base
        self.agent = base / "agents" / "shop_agent"
        copy_shop(self.agent)
        for name, text in case.get("agent_files", {}).items():
            (self.agent / name).write_text(text)
        self.evalset = base / "input" / "cases.evalset.json"
        self.evalset.parent.mkdir()
        if "evalset_text" in case:
            self.evalset.write_text(case["evalset_text"])
        elif "evalset_depth" in case:
            self.evalset.write_text("[" * case["evalset_depth"] + "]" * case["evalset_depth"])
        elif "evalset" in case:
            self.evalset.write_text(json.dumps(case["evalset"]))
        else:
            shutil.copy(EVALSET, self.evalset)
        self.config = base / "input" / "test_config.json"
        self.config.write_text(case["config_text"] if "config_text" in case
                               else json.dumps(case.get("config", DEFAULT_CONFIG)))
        self.local_store = "store" not in case
        self.store = str(base / "store") if self.local_store else case["store"]
        self.env = dict(case.get("env", {}))
        if case.get("needs") == "moto":
            assert moto is not None
            self.env.update(S3_ENV, AWS_ENDPOINT_URL=moto.url)
        self.oids: list[str] = []
        if case.get("store_objects") or case.get("store_refs"):
            store = Store(self.store)
            for spec in case.get("store_objects", []):
                self.oids.append(store.put_object(spec["kind"], _fixture_bytes(spec)))
            for spec in case.get("store_refs", []):
                store.put_ref(spec["namespace"], spec["name"], _fixture_bytes(spec))
        values = {"agent": str(self.agent), "evalset": str(self.evalset),
                  "config": str(self.config), "store": self.store}
        values.update({f"oid{i}": oid for i, oid in enumerate(self.oids)})
        self.args = [arg.format(**values) for arg in case["args"]]


def _run_case(case: dict[str, Any], base: Path, moto: Server | None) -> tuple[Prepared,
                                                                              CliResult]:
    prepared = Prepared(case, base, moto)
    try:
        result = run_inproc(*prepared.args, env=prepared.env, cwd=ROOT, timeout=240)
    except BaseException as exc:  # noqa: BLE001 - what a process would have died of
        pytest.fail(f"the CLI call let {type(exc).__name__}({exc}) out: {prepared.args}")
    return prepared, result


@pytest.fixture(scope="module")
def moto() -> Any:
    """An S3 emulator, started by the first case that needs one (``needs: moto``)."""
    server = start_moto()
    try:
        yield server
    finally:
        server.stop()


def test_the_catalogue_covers_issue_9() -> None:
    names = {p.stem for p in CASE_FILES}
    required = {"malformed_json", "evalset_wrong_field_type", "duplicate_eval_ids",
                "invocation_without_user_content", "unknown_metric", "criterion_wrong_type",
                "unimportable_custom_metric", "metric_raises", "metric_wrong_row_count",
                "metric_score_outside_interval", "judge_answer_unparseable",
                "agent_without_root_agent", "agent_model_always_raises",
                "store_unknown_protocol", "store_missing_bucket", "show_id_with_dotdot",
                "rescore_id_with_slash", "future_schema_record"}
    assert required <= names, sorted(required - names)


def _tmp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob(".tmp-*")] if root.exists() else []


@pytest.mark.parametrize("path", CASE_FILES, ids=[p.stem for p in CASE_FILES])
def test_bad_input(path: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    case = _load(path)
    moto = request.getfixturevalue("moto") if case.get("needs") == "moto" else None
    prepared, result = _run_case(case, tmp_path / path.stem, moto)
    expect = case["expect"]
    detail = f"{path.name}: stdout={result.stdout[-1500:]!r}\nstderr={result.stderr[-3000:]!r}"
    assert result.code == expect["exit"], detail
    if "stderr" in expect:
        assert expect["stderr"] in result.stderr, detail
    if "stdout" in expect:
        assert expect["stdout"] in result.stdout, detail
    if expect["exit"] == 2:  # a typed error, reported as one line, not a crash
        assert "error:" in result.stderr, detail
        assert "Traceback (most recent call last)" not in result.stderr, detail
    if "statuses" in expect or "inference" in expect:
        out = result.json
        got = {f"{c['eval_id']}/{m}": v["status"] for c in out["cases"]
               for m, v in c["metrics"].items()}
        for key, status in expect.get("statuses", {}).items():
            assert got.get(key) == status, (key, got, detail)
            metric = next(c["metrics"][key.split("/")[1]] for c in out["cases"]
                          if c["eval_id"] == key.split("/")[0])
            if status == "NOT_EVALUATED":
                assert metric["reason"], f"{key} is NOT_EVALUATED without a reason"
        inference = {c["eval_id"]: c["inference"] for c in out["cases"]}
        for eval_id, status in expect.get("inference", {}).items():
            assert inference.get(eval_id) == status, (inference, detail)
        assert out["complete"] is False and out["passed"] is False

    # No partial object behind: no temp files anywhere we wrote, every object verifies.
    assert _tmp_files(prepared.agent) == []
    if prepared.local_store:
        store_root = Path(prepared.store)
        assert _tmp_files(store_root) == []
        if store_root.exists():
            assert Store(prepared.store).verify() == []
