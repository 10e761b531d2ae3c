"""Issue 30 item 2, "Baselines that stick": ``--baseline last-good``, ``accept``, ``pin`` /
``unpin``, what gc keeps, and the tombstones it leaves — through the real CLI in this process.

The demo agent on a small eval set (three cases, two code metrics: no judge), one night after
another in one store (:func:`nights`, made once for the module; each test that changes the
store works on a copy):

1. the original references: passes (``--fail-on regression``, nothing to compare with yet);
2. an edited reference makes weather_paris · response_match_score FAIL: it regressed against
   night 1 (exit 1), so it is not good;
3. the same again: ``last-good`` is still night 1 (``latest`` would be night 2, against which
   nothing moved): exit 1 again — until someone accepts night 3;
4. the same again: compared with night 3 (accepted), exit 0.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests._cli import run_inproc
from tests.conftest import EVALSET, copy_shop

CASES = ["weather_paris", "cart_add_two_items", "greeting_then_weather"]
CRITERIA = {"tool_trajectory_avg_score": 1.0, "response_match_score": 0.5}
USER = {"EVALSNAP_USER": "alice"}


def _files(agent: Path) -> dict[str, Path]:
    """The small eval set, the same with weather_paris's expected answer edited (its
    response_match_score fails), and a config of two metrics, in the agent's copy."""
    data = json.loads((agent / EVALSET.name).read_text("utf-8"))
    data["eval_cases"] = [c for c in data["eval_cases"] if c["eval_id"] in CASES]
    small = agent / "small.evalset.json"
    small.write_text(json.dumps(data), "utf-8")
    for case in data["eval_cases"]:
        if case["eval_id"] == "weather_paris":
            case["conversation"][0]["final_response"]["parts"][0]["text"] = "Unrelated words."
    edited = agent / "edited.evalset.json"
    edited.write_text(json.dumps(data), "utf-8")
    config = agent / "small_config.json"
    config.write_text(json.dumps({"criteria": CRITERIA}), "utf-8")
    return {"agent": agent, "small": small, "edited": edited, "config": config}


def _night(files: dict[str, Path], store: Path, evalset: str, *extra: str) -> Any:
    return run_inproc("run", str(files["agent"]), str(files[evalset]), "--config",
                      str(files["config"]), "--store", str(store), "--reuse", "--json", *extra)


def _writer_started_ago(store: Path, seconds: float) -> None:
    """``v1/STORE`` dated ``seconds`` ago: every writing command (pin and unpin too) rewrites
    it when it starts, and gc sweeps objects only once the latest writer is not recent
    (:data:`evalsnap.records.gc._STEP`); as if that long had passed since the last one."""
    marker = store / "v1" / "STORE"
    assert marker.is_file(), marker
    old = time.time() - seconds
    os.utime(marker, (old, old))


LAST_GOOD = ("--baseline", "last-good", "--fail-on", "regression")


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("nights")
    agent = copy_shop(base / "agents" / "shop_agent")
    files = _files(agent)
    store = base / "store"
    n1 = _night(files, store, "small", *LAST_GOOD)
    n2 = _night(files, store, "edited", *LAST_GOOD)
    n3 = _night(files, store, "edited", *LAST_GOOD)
    accepted = run_inproc("accept", n3.json["run_id"], "--note", "the new reference answer",
                          "--store", str(store), "--json", env=USER)
    n4 = _night(files, store, "edited", *LAST_GOOD)
    return {"files": files, "store": store, "n1": n1, "n2": n2, "n3": n3, "n4": n4,
            "accepted": accepted}


@pytest.fixture
def store_copy(nights: dict[str, Any], tmp_path: Path) -> Path:
    store = tmp_path / "store"
    shutil.copytree(nights["store"], store)
    return store


def _ids(nights: dict[str, Any]) -> dict[str, str]:
    return {n: nights[n].json["run_id"] for n in ("n1", "n2", "n3", "n4")}


def test_last_good_keeps_failing_until_accepted(nights: dict[str, Any]) -> None:
    n1, n2, n3, n4 = (nights[n] for n in ("n1", "n2", "n3", "n4"))
    # night 1: nothing good yet, nothing compared; it passes its gate
    assert n1.code == 0, n1.stderr[-3000:]
    assert n1.json["baseline"]["requested"] == "last-good"
    assert n1.json["baseline"]["record_oid"] is None and n1.json["regressions"] == []
    assert "accepted or passed its gate" in n1.stderr
    # night 2: regressed against night 1, so it is not good
    assert n2.code == 1, n2.stderr[-3000:]
    assert n2.json["baseline"]["run_id"] == n1.json["run_id"]
    assert [(r["eval_id"], r["metric"]) for r in n2.json["regressions"]] == [
        ("weather_paris", "response_match_score")]
    # night 3: the same agent and data; last-good is still night 1 (latest would be night 2,
    # against which nothing moved), so it fails again
    assert n3.code == 1, n3.stderr[-3000:]
    assert n3.json["baseline"]["run_id"] == n1.json["run_id"] != n2.json["run_id"]
    assert len(n3.json["regressions"]) == 1
    # accepted, with who and when, in the store
    accepted = nights["accepted"]
    assert accepted.code == 0, accepted.stderr[-3000:]
    mark = accepted.json["accepted"]
    assert (mark["run_id"], mark["by"], mark["note"]) == (n3.json["run_id"], "alice",
                                                          "the new reference answer")
    assert mark["at"].endswith("Z") and mark["record_id"] == n3.json["record_id"]
    ref = nights["store"] / "v1" / "refs" / "accepted" / "shop" / n3.json["run_id"]
    assert json.loads(ref.read_text("utf-8"))["by"] == "alice"
    # night 4: compared with the accepted night 3: nothing regressed
    assert n4.code == 0, n4.stderr[-3000:]
    assert n4.json["baseline"]["run_id"] == n3.json["run_id"]
    assert n4.json["regressions"] == [] and n4.json["passed"] is False  # the known failure
    # each run recorded its gate
    shown = run_inproc("show", n2.json["run_id"], "--store", str(nights["store"]), "--json")
    assert shown.code == 0 and shown.json["record"]["fail_on"] == "regression"


def test_a_run_is_good_by_its_own_recorded_gate(nights: dict[str, Any]) -> None:
    """Re-evaluated from the store: the gate it ran with; records without one by quality."""
    from evalsnap.records import EvaluationRecord, repo
    from evalsnap.reports.lastgood import passed_own_gate

    store = repo.open_store(str(nights["store"]))
    records = {n: (nights[n].json["record_id"],
                   repo.get(store, EvaluationRecord, nights[n].json["record_id"]))
               for n in ("n1", "n2", "n4")}

    def good(night: str, fail_on: str | None) -> bool:
        oid, record = records[night]
        return passed_own_gate(store, oid, record.model_copy(update={"fail_on": fail_on}))

    assert good("n1", "regression") and not good("n2", "regression") and good("n4", "regression")
    assert good("n1", None) and not good("n4", None), "an old record counts with quality"
    assert not good("n4", "quality") and good("n2", "never") and good("n2", "incomplete")


def test_gc_keeps_pinned_accepted_and_last_good_runs_and_leaves_tombstones(
        nights: dict[str, Any], store_copy: Path) -> None:
    files, ids, store = nights["files"], _ids(nights), str(store_copy)
    # night 5 fails its own gate (quality): the newest run, but not good
    n5 = _night(files, store_copy, "edited")
    assert n5.code == 1, n5.stderr[-3000:]
    pinned = run_inproc("pin", ids["n1"], "--label", "release 1.0", "--store", store, "--json",
                        env=USER)
    assert pinned.code == 0, pinned.stderr[-3000:]
    assert (pinned.json["pinned"]["label"], pinned.json["pinned"]["by"]) == ("release 1.0", "alice")
    listed = run_inproc("ls", "--store", store, "--json")
    assert listed.code == 0, listed.stderr[-3000:]
    by_run = {r["run_id"]: r for r in listed.json["runs"]}
    assert by_run[ids["n1"]]["pinned"]["label"] == "release 1.0"
    assert by_run[ids["n3"]]["accepted"]["by"] == "alice"
    assert by_run[ids["n2"]]["pinned"] is None is by_run[ids["n2"]]["accepted"]
    table = run_inproc("ls", "--store", store, env={"COLUMNS": "300"})
    assert "pinned (release 1.0)" in table.stdout and "accepted by alice" in table.stdout

    # the pin started a writer: gc sweeps objects only once it is not recent
    _writer_started_ago(store_copy, 3)
    report = run_inproc("gc", "--store", store, "--keep-last", "1", "--grace", "0", "--json")
    assert report.code == 0, report.stderr[-3000:]
    why = {r["run_id"]: r["why"] for r in report.json["runs_kept"]}
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert why == {n5.json["run_id"]: "newest of its eval set",
                   ids["n4"]: "last-good of its eval set",
                   ids["n3"]: f"accepted by alice on {today}",
                   ids["n1"]: "pinned (release 1.0)"}, why
    assert [r["run_id"] for r in report.json["runs_removed"]] == [ids["n2"]]
    assert report.json["tombstones_written"] == 1
    assert report.json["objects_deferred"] is None and report.json["kinds"]["record"]["removed"] == 1
    assert report.json["kinds"]["pin"]["kept"] == 1 and report.json["kinds"]["accepted"]["kept"] == 1
    verify = run_inproc("verify", "--store", store, "--json")
    assert verify.code == 0, verify.stdout[-3000:]
    for kept in (ids["n1"], ids["n3"], ids["n4"]):
        assert run_inproc("show", kept, "--store", store, "--json").code == 0

    # unpinned, night 1 goes with the next gc; tombstones and marks stay
    unpinned = run_inproc("unpin", ids["n1"], "--store", store, "--json")
    assert unpinned.code == 0 and unpinned.json["unpinned"] == ids["n1"], unpinned.stderr
    assert run_inproc("unpin", ids["n1"], "--store", store).code == 2  # not pinned any more
    _writer_started_ago(store_copy, 3)
    again = run_inproc("gc", "--store", store, "--keep-last", "1", "--grace", "0", "--json")
    assert again.code == 0, again.stderr[-3000:]
    assert [r["run_id"] for r in again.json["runs_removed"]] == [ids["n1"]]
    assert again.json["kinds"]["tombstone"]["kept"] == 2  # night 2's: by run and by record
    assert run_inproc("verify", "--store", store).code == 0
    graves = store_copy / "v1" / "refs" / "tombstones"
    assert {p.name for p in (graves / "runs").iterdir()} == {ids["n1"], ids["n2"]}
    assert (store_copy / "v1" / "refs" / "accepted" / "shop" / ids["n3"]).is_file()

    # a removed run's id, or its record's, says what happened to it
    for ref in (ids["n2"], nights["n1"].json["record_id"], nights["n1"].json["record_id"][7:19]):
        shown = run_inproc("show", ref, "--store", store)
        assert shown.code == 2, (ref, shown.stderr[-3000:])
        assert "removed by gc on " + today in shown.stderr and "pin" in shown.stderr, shown.stderr
    baseline = _night(files, store_copy, "edited", "--baseline", ids["n2"])
    assert baseline.code == 2 and "removed by gc on" in baseline.stderr, baseline.stderr[-3000:]
    never = run_inproc("show", "20200101T000000Z-abcdef", "--store", store)
    assert never.code == 2 and "removed by gc" not in never.stderr


def test_damaged_marks_are_findings_not_crashes(nights: dict[str, Any], store_copy: Path) -> None:
    ids, store, refs = _ids(nights), str(store_copy), store_copy / "v1" / "refs"
    (refs / "pins").mkdir()
    (refs / "pins" / ids["n2"]).write_bytes(b"{not json")
    (refs / "accepted" / "shop" / ids["n1"]).write_text(json.dumps({"run_id": 5}), "utf-8")
    (refs / "tombstones" / "runs").mkdir(parents=True)
    (refs / "tombstones" / "runs" / "20200101T000000Z-abcdef").write_bytes(b"\xff\xfe")
    # a mark filed under another run than the one it names
    moved = json.loads((refs / "accepted" / "shop" / ids["n3"]).read_text("utf-8"))
    (refs / "accepted" / "shop" / ids["n4"]).write_text(json.dumps(moved), "utf-8")

    verify = run_inproc("verify", "--store", store, "--json")
    assert verify.code == 1, verify.stdout[-3000:] + verify.stderr[-3000:]
    problems = [p for p in verify.json["problems"] if p["kind"] == "mark"]
    assert len(problems) == 4 and len(verify.json["problems"]) == 4, verify.json["problems"]
    assert {Path(p["location"]).name for p in problems} == {
        ids["n2"], ids["n1"], ids["n4"], "20200101T000000Z-abcdef"}

    listed = run_inproc("ls", "--store", store, "--json")
    assert listed.code == 0, listed.stderr[-3000:]
    assert "damaged" in {r["run_id"]: r for r in listed.json["runs"]}[ids["n2"]]["pinned"]
    shown = run_inproc("show", "20200101T000000Z-abcdef", "--store", store)
    assert shown.code == 2 and "cannot be read" in shown.stderr, shown.stderr[-3000:]

    # the damaged acceptances are ignored (and said so): last-good is night 4, which passed
    # its gate
    n5 = _night(nights["files"], store_copy, "edited", *LAST_GOOD)
    assert n5.code == 0, n5.stderr[-3000:]
    assert n5.json["baseline"]["run_id"] == ids["n4"]
    assert "ignoring the acceptance of run" in n5.stderr

    gc = run_inproc("gc", "--store", store, "--keep-last", "1", "--grace", "0", "--json")
    assert gc.code == 0, gc.stderr[-3000:]
    why = {r["run_id"]: r["why"] for r in gc.json["runs_kept"]}
    assert why[ids["n2"]].startswith("pinned (its mark cannot be read")
    assert why[ids["n1"]].startswith("accepted (its mark cannot be read")
    assert any(ids["n2"] in w for w in gc.json["warnings"])
    assert (refs / "pins" / ids["n2"]).read_bytes() == b"{not json"  # gc leaves marks alone

    assert run_inproc("unpin", ids["n2"], "--store", store).code == 0  # a damaged pin goes too
    assert not (refs / "pins" / ids["n2"]).exists()
    too_long = run_inproc("pin", ids["n3"], "--label", "x" * 3000, "--store", store)
    assert too_long.code == 2 and "at most" in too_long.stderr
    # a label is a person's text, printed as it is (never read as rich markup)
    odd = run_inproc("pin", ids["n3"], "--label", "[/] [red]x", "--store", store)
    assert odd.code == 0 and "[/] [red]x" in odd.stdout, odd.stdout + odd.stderr[-3000:]
    wide = {"COLUMNS": "400"}
    for args in (("gc", "--keep-last", "1", "--grace", "0", "--dry-run"), ("ls",)):
        shown = run_inproc(*args, "--store", store, env=wide)
        assert shown.code == 0 and "pinned ([/] [red]x)" in shown.stdout, shown.stderr[-3000:]
