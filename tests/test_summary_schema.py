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


def test_a_runs_summary_holds_its_rows_as_json_and_writes_the_same_line(
        demo: dict[str, Any]) -> None:
    """Issue 31 (memory): a run's summary keeps each case's and each aggregate's row as its
    JSON (:class:`Rows`: at 10,000 cases ~60 MB against ~400 MB of models); the rows read as
    the list they were, and the ``--json`` line written a row at a time is the model's."""
    import io
    import pickle

    from evalsnap.pipeline import context
    from evalsnap.records import EvaluationRecord, repo
    from evalsnap.reports.summary import summary
    from evalsnap.reports.summary_model import Aggregate, CaseResult, Rows, write_json

    record_oid = demo["cold"].json["record_id"]
    store = context.RunContext.open(str(demo["store"])).store
    result = summary(store, record_oid, repo.get(store, EvaluationRecord, record_oid))
    assert isinstance(result.cases, Rows) and isinstance(result.aggregates, Rows)
    as_lists = RecordResult.model_validate_json(result.model_dump_json())
    assert isinstance(as_lists.cases, list) and len(as_lists.cases) == len(result.cases) > 1
    assert result.cases == as_lists.cases and result.aggregates == as_lists.aggregates
    assert list(result.cases) == as_lists.cases and result.cases[-1] == as_lists.cases[-1]
    assert result.cases[1:3] == as_lists.cases[1:3]
    assert all(isinstance(c, CaseResult) for c in result.cases)
    assert all(isinstance(a, Aggregate) for a in result.aggregates)
    assert result.model_dump() == as_lists.model_dump()
    assert result.model_dump(mode="json") == as_lists.model_dump(mode="json")
    written = io.StringIO()
    write_json(result, written)
    assert written.getvalue() == as_lists.model_dump_json() == result.model_dump_json()
    assert pickle.loads(pickle.dumps(result)) == result
    changed = as_lists.model_copy(update={"cases": as_lists.cases[:-1]})
    assert result.cases != changed.cases


def test_rows_past_the_memory_limit_are_in_a_file_and_read_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31 (memory): past ``ROWS_IN_MEMORY`` bytes a summary's rows are in a temporary
    file; they read, slice, iterate (across the 512-row blocks), compare and pickle as the
    rows kept in memory do."""
    import pickle

    from evalsnap import rows as summary_model
    from evalsnap.reports.summary_model import MetricResult, Rows

    models = [MetricResult(status="PASSED", score=n / 1500, reason=f"case {n}")
              for n in range(1500)]
    in_memory = Rows(MetricResult, models)
    monkeypatch.setattr(summary_model, "ROWS_IN_MEMORY", 1000)
    spilled = Rows(MetricResult, models)
    assert spilled._items._file._rolled and not in_memory._items._file._rolled  # type: ignore[attr-defined]
    assert len(spilled) == 1500 and list(spilled) == models == list(in_memory)
    assert spilled[0] == models[0] and spilled[511] == models[511] and spilled[512] == models[512]
    assert spilled[-1] == models[-1] and spilled[700:705] == models[700:705]
    assert spilled[::499] == models[::499] and spilled == in_memory
    assert list(spilled.json_items()) == [m.model_dump_json().encode() for m in models]
    assert pickle.loads(pickle.dumps(spilled)) == spilled
    with pytest.raises(IndexError):
        spilled[1500]
    assert Rows(MetricResult, models[:-1]) != spilled


def test_rows_grow_at_the_end_and_let_go() -> None:
    """Rows are added with ``extend`` (models) and ``extend_json`` (another's rows), joined
    with ``+`` (neither side changes), and ``clear`` lets them all go."""
    from evalsnap.reports.summary_model import MetricResult, Rows

    models = [MetricResult(status="PASSED", score=n / 10) for n in range(10)]
    rows = Rows(MetricResult, models[:3])
    rows.extend(models[3:6])
    other = Rows.of_json(MetricResult, [m.model_dump_json().encode() for m in models[6:8]])
    rows.extend_json(other.json_items())
    assert list(rows) == models[:8] and len(rows) == 8
    both = rows + models[8:]
    assert list(both) == models and len(rows) == 8
    assert list(rows + other) == models[:8] + models[6:8]
    assert both[-1] == models[-1] and list(both.json_items())[3] == models[3].model_dump_json().encode()
    both.clear()
    assert len(both) == 0 and list(both) == [] and len(rows) == 8


def test_rows_read_as_a_list() -> None:
    from evalsnap.reports.summary_model import MetricResult, Rows

    models = [MetricResult(status="PASSED", score=s) for s in (0.5, 1.0, 0.25)]
    rows = Rows(MetricResult, models)
    assert len(rows) == 3 and rows[0] == models[0] and rows[-1] == models[-1]
    assert rows[::2] == models[::2] and list(rows) == models and rows == models
    assert rows != models[:2] and rows != "abc" and not Rows(MetricResult)
    assert rows.json_items()[1] == models[1].model_dump_json().encode()
    with pytest.raises(IndexError):
        rows[3]
    assert repr(rows) == "Rows[MetricResult](3 rows)"


def test_strings_a_record_repeats_are_held_once() -> None:
    """Issue 31 (memory): a record of 10,000 cases × 7 metrics names each rule's fingerprint
    10,000 times; parsed, each is one string in memory, not one per unit."""
    from evalsnap.records.record import UnitRef

    def ref(eval_id: str) -> dict[str, Any]:
        return {"eval_id": eval_id, "repetition": 0, "metric_name": "m" * 20,
                "unit_oid": "sha256:" + "a" * 64, "unit_fingerprint": "sha256:" + "b" * 64,
                "case_fingerprint": "sha256:" + "c" * 64, "rule_fingerprint": "sha256:" + "d" * 64,
                "reused": False, "why": "new"}

    one, two = (UnitRef.model_validate_json(json.dumps(ref(e))) for e in ("case-1", "case-2"))
    assert one.rule_fingerprint is two.rule_fingerprint
    assert one.case_fingerprint is two.case_fingerprint and one.metric_name is two.metric_name
    assert one.unit_oid == two.unit_oid


def test_values_given_the_same_fields_share_one_fields_set_and_copies_stay_apart() -> None:
    """Issue 31 (memory): pydantic keeps a set of the given field names per instance (0.2-0.7
    KB; ~370,000 of them at 10,000 cases); frozen values given the same fields share one. A
    copy with an update gets its own: the shared set is never changed in place."""
    from evalsnap.records.record import TokenCounts, UnitRef

    def ref(eval_id: str, **more: Any) -> UnitRef:
        return UnitRef.model_validate_json(json.dumps({
            "eval_id": eval_id, "repetition": 0, "metric_name": "m",
            "unit_oid": "sha256:" + "a" * 64, "unit_fingerprint": "sha256:" + "b" * 64,
            "case_fingerprint": "sha256:" + "c" * 64, "rule_fingerprint": "sha256:" + "d" * 64,
            "reused": False, "why": "new", **more}))

    one, two, other = ref("case-1"), ref("case-2"), ref("case-3", reused_from_run="r")
    assert one.model_fields_set is two.model_fields_set
    assert other.model_fields_set == one.model_fields_set | {"reused_from_run"}
    copied = one.model_copy(update={"reused_from_record": "x"})
    assert "reused_from_record" in copied.model_fields_set
    assert "reused_from_record" not in one.model_fields_set | two.model_fields_set
    assert one.model_dump(exclude_unset=True) == {**two.model_dump(exclude_unset=True),
                                                  "eval_id": "case-1"}
    assert TokenCounts(total_tokens=3).model_fields_set == {"total_tokens"}
    with pytest.raises(ValueError):
        one.why = "changed"  # frozen: nothing adds to the shared set by assignment


def test_a_runs_unit_verdicts_are_kept_as_rows_and_read_back_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a publish keeps of each unit (its verdict, for the summary, the aggregates and
    the page) is a packed row under a short key, past a few MB in a temporary file: read
    back, it is the verdict it was, whatever its values."""
    from evalsnap import rows
    from evalsnap.records import repo
    from evalsnap.records.unit import UnitVerdict, VerdictRow

    monkeypatch.setattr(rows, "ROWS_IN_MEMORY", 2000)  # spilled after ~15 verdicts
    memo = repo._Verdicts(60)

    def verdict(n: int) -> UnitVerdict:
        return UnitVerdict(score=None if n % 3 else n / 7, status="PASSED" if n % 2 else "FAILED",
                           metric_status="FAILED", gate_score=n / 3, threshold=0.5,
                           complete=bool(n % 5), reason=None if n % 4 else f"réponse «{n}» \"ok\"",
                           judge_calls=n, trace="trace ✓",
                           rows=tuple(VerdictRow(i / 2 if i else None, "PASSED") for i in range(n % 3)))

    for n in range(60):
        memo.put(f"sha256:{n:064x}", verdict(n))
    memo.put(f"sha256:{0:064x}", verdict(1))  # a unit's verdict is kept once: the first stays
    assert [memo.get(f"sha256:{n:064x}") for n in range(60)] == [verdict(n) for n in range(60)]
    assert memo.get(f"sha256:{99:064x}") is None and not memo.has(f"sha256:{99:064x}")
    memo.put(f"sha256:{60:064x}", verdict(60))  # past its size it starts again
    assert memo.get(f"sha256:{0:064x}") is None and memo.get(f"sha256:{60:064x}") == verdict(60)


def test_rows_from_a_local_scoring_process_travel_as_a_file_the_receiver_takes_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scoring process's rows past a few MB reach the flow's process as a temporary file
    (not ~100 MB through the pipe): the same rows,
    read (twice, as Prefect's future does), gone once the receiver lets them go, and rows
    added after it still read back; elsewhere rows pickle as their bytes."""
    import pickle
    import tempfile

    from evalsnap import rows
    from evalsnap.reports.summary_model import MetricResult

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(rows, "ROWS_IN_MEMORY", 4000)
    items = [MetricResult(status="PASSED", score=n / 3, threshold=0.5) for n in range(300)]
    sent = rows.Rows(MetricResult, items)
    assert len(pickle.dumps(sent)) > 4000 * 2  # not by file: the rows' bytes in the pickle
    monkeypatch.setattr(rows, "_BY_FILE", True)
    data = pickle.dumps(sent)
    assert len(data) < 4000 and len(list(tmp_path.iterdir())) == 1  # by file
    again, got = pickle.loads(data), pickle.loads(data)  # Prefect's future reads it twice
    assert again == items
    assert got == items and got[-1] == items[-1] and got[5:7] == items[5:7]
    got.extend(items[:2])
    assert list(got) == items + items[:2]
    got.clear()  # once the receiver has taken the rows, the file goes
    assert list(tmp_path.iterdir()) == [] and len(got) == 0
    small = rows.Rows(MetricResult, items[:3])
    assert pickle.loads(pickle.dumps(small)) == items[:3] and list(tmp_path.iterdir()) == []
