"""``explain``, ``diff`` and ``ls`` over records built with the plain stage functions.

Record A scores everything. Record B (with reuse) changes one thing per input: the
reference of ``weather_paris``, the agent output of ``weather_two_cities``, the threshold
of ``response_match_score`` and the version of the custom metric. Record C forces a
rescore of B's inputs. The commands run in-process through typer's runner.
"""

from __future__ import annotations

import json

import pytest
from _pipeline import (
    Result,
    evaluate,
    example_config,
    example_eval_set,
    infer_all,
    with_reference_text,
)
from typer.testing import CliRunner

from evalsnap.fingerprint import fingerprint
from evalsnap.pipeline.outcomes import InferenceOutcome
from evalsnap.records import repo
from evalsnap.reports.diff import diff
from evalsnap.reports.explain import explain

CHANGED_INFERENCE = "weather_two_cities"


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result | str]:
    url = str(tmp_path_factory.mktemp("explain") / "store")
    store = repo.open_store(url)
    outcomes = infer_all(url, example_eval_set())
    a = evaluate(url, example_eval_set(), example_config(), outcomes, reuse=False, kind="run")
    # the agent "answers differently" for one case: a new inference record
    changed = []
    for o in outcomes:
        if o.eval_id == CHANGED_INFERENCE:
            rec = repo.get_inference(store, o.oid)
            last = rec.invocations[-1]
            text = last.final_response.model_copy(update={"parts": [
                last.final_response.parts[0].model_copy(update={"text": "No idea, sorry."})]})
            rec = rec.model_copy(update={
                "invocations": [*rec.invocations[:-1],
                                last.model_copy(update={"final_response": text})],
                "inference_fingerprint": fingerprint("test-inference", "changed")})
            o = InferenceOutcome(eval_id=o.eval_id, oid=repo.put(store, rec),
                                 fingerprint=rec.inference_fingerprint, status="success",
                                 run_id=rec.run_id)
        changed.append(o)
    config = example_config()
    config["criteria"]["response_match_score"] = 0.99
    config["customMetrics"]["response_mentions_city"]["version"] = "2"
    edited = with_reference_text(example_eval_set(), "weather_paris", "Paris: sunny, 21 degrees.")
    b = evaluate(url, edited, config, changed, reuse=True)
    c = evaluate(url, edited, config, changed, reuse=True, force=True)
    return {"url": url, "a": a, "b": b, "c": c}


def _by_key(units: list[dict]) -> dict[tuple[str, str], dict]:
    return {(u["eval_id"], u["metric"]): u for u in units}


def test_explain_names_the_reason_of_every_unit(records) -> None:
    store = repo.open_store(records["url"])
    a, b, c = records["a"], records["b"], records["c"]
    ea = explain(store, a.record_oid, a.record)
    assert {u["why"] for u in ea["units"]} == {"reuse not requested"}
    assert ea["scored_units"] == len(a.record.units) and ea["reused_units"] == 0

    eb = explain(store, b.record_oid, b.record)
    assert eb["parent_record"] == a.record_oid
    units = _by_key(eb["units"])
    incomplete = {k for k, u in _by_key(ea["units"]).items() if not u["complete"]}
    for (case, metric), u in units.items():
        if metric == "response_match_score":
            assert u["why"] == "rule changed" and "rule" in u["moved_vs_parent"]
        elif metric == "response_mentions_city":
            assert u["why"] == "evaluator version changed", (case, u["why"])
        elif case == "weather_paris":
            assert u["why"] == "reference changed" and u["moved_vs_parent"] == ["case"]
        elif case == CHANGED_INFERENCE:
            assert u["why"] == "inference changed" and u["moved_vs_parent"] == ["case"]
        elif (case, metric) in incomplete:
            assert u["why"] == "incomplete before" and u["action"] == "scored"
        else:
            assert u["action"] == "reused" and u["why"] == "reused", (case, metric)
            assert u["reused_from_record"] == a.record_oid
            assert u["reused_from_run"] == a.record.run_id
            assert u["moved_vs_parent"] == []
    assert eb["why_counts"]["reused"] == eb["reused_units"]

    ec = explain(store, c.record_oid, c.record)
    assert {u["why"] for u in ec["units"]} == {"forced"} and ec["parent_record"] == b.record_oid


def test_diff_names_the_input_that_moved(records) -> None:
    store = repo.open_store(records["url"])
    a, b, c = records["a"], records["b"], records["c"]
    d = diff(store, a.record_oid, a.record, b.record_oid, b.record)
    units = _by_key(d["units"])
    assert units[("weather_paris", "tool_trajectory_avg_score")]["moved"] == ["reference"]
    assert units[(CHANGED_INFERENCE, "tool_trajectory_avg_score")]["moved"] == ["inference"]
    assert units[("weather_paris", "response_match_score")]["moved"] == ["reference", "rule"]
    rms = units[("cart_add_two_items", "response_match_score")]
    assert rms["moved"] == ["rule"] and "threshold 0.5 → 0.99" in rms["rule_changes"]
    city = units[("cart_add_two_items", "response_mentions_city")]
    assert city["moved"] == ["rule"] and city["rule_changes"] == ["evaluator identity"]
    same = units[("cart_add_two_items", "tool_trajectory_avg_score")]
    assert same["same_unit"] and same["change"] == "none" and same["moved"] == []
    # the stricter threshold turns at least one pass into a failure, and diff says so
    flipped = [u for u in d["units"] if u["metric"] == "response_match_score"
               and u["status_a"] == "PASSED" and u["status_b"] == "FAILED"]
    assert flipped and all(u["change"] == "status" for u in flipped)
    # the changed answer no longer matches its reference
    inf = units[(CHANGED_INFERENCE, "response_match_score")]
    assert inf["score_b"] < inf["score_a"]
    # forcing the same inputs moves nothing and changes no score
    same_inputs = diff(store, b.record_oid, b.record, c.record_oid, c.record)
    assert {u["change"] for u in same_inputs["units"]} == {"none"}
    assert all(u["same_unit"] for u in same_inputs["units"])


def _invoke(*args: str):
    from evalsnap.cli import app

    return CliRunner().invoke(app, list(args))


def _json_of(output: str) -> dict:
    lines = [ln for ln in output.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, output[-3000:]
    return json.loads(lines[0])


def test_cli_explain_diff_ls(records) -> None:
    url, a, b, c = records["url"], records["a"], records["b"], records["c"]
    r = _invoke("explain", b.record.run_id, "--store", url, "--json")
    assert r.exit_code == 0, r.output
    out = _json_of(r.output)
    assert out["record_id"] == b.record_oid
    assert len(out["units"]) == len(b.record.units)

    r = _invoke("explain", b.record_oid, "--store", url)  # a table for people
    assert r.exit_code == 0 and "reference changed" in r.output and "reused" in r.output

    r = _invoke("diff", a.record.run_id, b.record_oid[:20], "--store", url, "--json")
    assert r.exit_code == 0, r.output
    out = _json_of(r.output)
    assert (out["record_a"], out["record_b"]) == (a.record_oid, b.record_oid)
    assert out["changes"]["none"] > 0

    r = _invoke("diff", a.record_oid, b.record_oid, "--store", url)
    assert r.exit_code == 0 and "reference" in r.output and "inference" in r.output

    r = _invoke("ls", "--store", url, "--json")
    assert r.exit_code == 0, r.output
    out = _json_of(r.output)
    assert [x["run_id"] for x in out["runs"]] == [c.record.run_id, b.record.run_id,
                                                  a.record.run_id]
    assert [x["record_id"] for x in out["records"]] == [c.record_oid, b.record_oid,
                                                        a.record_oid]
    assert {s["snapshot_id"] for s in out["snapshots"]} == {
        a.snapshot_oid, b.snapshot_oid, c.snapshot_oid}
    r = _invoke("ls", "--store", url)
    assert r.exit_code == 0
    assert all(x.record.run_id in r.output for x in (a, b, c)), r.output


def test_cli_diff_unknown_record_exits_2(records) -> None:
    r = _invoke("diff", "latest", "not-a-run", "--store", records["url"])
    assert r.exit_code == 2
    assert "not-a-run" in r.output and "evalsnap ls" in r.output
