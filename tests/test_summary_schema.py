"""The run summary — the ``--json`` contract — is a typed model: its JSON schema is pinned by
a committed golden file, and a real ``--json`` line is exactly that model (no undeclared key,
the same bytes when dumped again)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from evalsnap.reports.summary_model import RecordResult, RunSummary, SuiteResult

GOLDEN = Path(__file__).parent / "golden" / "summary.schema.json"
REGENERATE = "EVALSNAP_REGENERATE_GOLDEN"


def _schema() -> str:
    return json.dumps(RunSummary.model_json_schema(), indent=2, sort_keys=True,
                      ensure_ascii=False) + "\n"


def test_the_summary_schema_is_the_golden_one() -> None:
    if os.environ.get(REGENERATE):
        GOLDEN.write_text(_schema(), "utf-8")
    assert _schema() == GOLDEN.read_text("utf-8"), (
        "The --json contract (evalsnap/reports/summary_model.py) no longer matches "
        "tests/golden/summary.schema.json. Users and CI scripts read that JSON: if the change "
        f"is on purpose, regenerate the file with `{REGENERATE}=1 python -m pytest "
        "tests/test_summary_schema.py -k golden`, review its diff, and commit it with the change.")


def _same_line(line: str) -> RecordResult | SuiteResult:
    """The model of a ``--json`` line, checked to dump back to the very same line."""
    found = RunSummary.model_validate_json(line).root
    assert found.model_dump_json() == line
    return found


@pytest.fixture(scope="module")
def demo(golden_demo, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    agent, store, cold = golden_demo.copy(tmp_path_factory.mktemp("schema"))
    return {"agent": agent, "store": store, "cold": cold}


def test_a_run_line_is_the_model(demo: dict[str, Any]) -> None:
    line = demo["cold"].stdout.strip()
    found = _same_line(line)
    assert isinstance(found, RecordResult) and found.kind == "run"
    assert found.exit_code == demo["cold"].code and found.fail_on == "quality"
    assert found.report_url and found.store_requests["total"] > 0
    assert "baseline" not in json.loads(line)  # asked for none: the comparison is left out
    unit = found.cases[0].metrics["response_match_score"]
    assert unit.status in ("PASSED", "FAILED") and unit.complete and not unit.reused


def test_a_rescore_line_with_a_baseline_is_the_model(demo: dict[str, Any], cli) -> None:
    r = cli("rescore", "latest", "--config", str(demo["agent"] / "test_config.json"),
            "--store", str(demo["store"]), "--reuse", "--baseline", "latest", "--json")
    found = _same_line(r.stdout.strip())
    assert isinstance(found, RecordResult) and found.kind == "rescore"
    assert found.baseline is not None and found.baseline.record_oid is not None
    assert found.regressions == [] and found.fixes == []  # the same inference, the same rules
    rows = [m for c in found.cases for m in c.metrics.values()]
    assert found.reused_units == sum(m.reused for m in rows) > found.scored_units


def test_an_undeclared_key_is_refused(demo: dict[str, Any]) -> None:
    data = json.loads(demo["cold"].stdout)
    data["cases"][0]["metrics"]["response_match_score"]["surprise"] = 1
    with pytest.raises(ValueError, match="surprise"):
        RunSummary.model_validate(data)


def test_a_suite_line_is_the_model(demo: dict[str, Any]) -> None:
    """A run over several eval sets: the records in ``runs``, the totals, the worst code."""
    from evalsnap.reports.suite import combined

    one = RecordResult.model_validate_json(demo["cold"].stdout)
    two = one.model_copy(update={"eval_set_id": "other", "exit_code": 1})
    suite = combined([one, two])
    assert isinstance(suite, SuiteResult) and suite.exit_code == max(one.exit_code, 1)
    line = suite.model_dump_json()
    assert "fail_on" not in json.loads(line)  # not yet gated
    assert _same_line(line) == suite


def test_a_caller_in_this_process_takes_the_model_and_the_flow_returns_its_head(
        demo: dict[str, Any]) -> None:
    """Issue 31 (memory): the CLI and the Python API read the summary's model from the run's
    context; the flow then returns only the object's head instead of the whole object as
    JSON data a second time (at 10,000 cases ~450 MB next to the model). Called directly
    (a deployment, a parent flow), it returns the whole object as before."""
    from evalsnap.api import flow_result
    from evalsnap.pipeline import context
    from flows.rescore import rescore

    args = {"run_or_snapshot": demo["cold"].json["run_id"], "store": str(demo["store"]),
            "config": str(demo["agent"] / "test_config.json"), "reuse": True,
            "fail_on": "never"}
    ctx = context.RunContext(str(demo["store"]))
    ctx.keeps_summary = True
    with context.given(ctx):
        state = rescore(**args, return_state=True)
    head = state.result()
    model = ctx.summary
    assert isinstance(model, RecordResult)
    assert "cases" not in head and "aggregates" not in head and "summary" in head
    assert head["record_id"] == model.record_id and head["exit_code"] == model.exit_code == 0
    assert flow_result(state, ctx) is model and ctx.summary is None

    whole = rescore(**args)  # no caller's context: the whole object, as plain data
    assert isinstance(whole, dict) and len(whole["cases"]) == len(model.cases)
    mine = model.model_dump(mode="json")
    drop = {"run_id", "record_id", "report_url", "store_requests", "parent_record", "adk_history_path",
            "baseline", "regressions", "fixes", "not_compared", "metric_deltas"}
    assert {k: v for k, v in whole.items() if k not in drop} == \
        {k: v for k, v in mine.items() if k not in drop}
