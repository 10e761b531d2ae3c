"""``report RECORD --junit FILE``: a record as JUnit XML, for CI systems.

One ``<testsuite>`` per record (named after the eval set) and one ``<testcase>`` per case ×
metric over its repetitions (:mod:`evalsnap.aggregates`): ``classname`` is
``<eval set>.<eval_id>``, ``name`` the metric, and the text lists every repetition. A
``FAILED`` status by the repetition gate is a ``<failure>``; a case × metric with an
incomplete repetition (``NOT_EVALUATED``, an errored judge sample, a failed inference) is an
``<error>``, never ``<skipped>``: the run is incomplete (exit 3) and CI must not show it green.
Passing and informational metrics pass. A case with no unit at all (its inference failed
before any metric) is one ``<testcase name="inference">`` with an ``<error>``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from evalsnap.records import EvaluationRecord
from evalsnap.reports.summary import summary
from evalsnap.reports.summary_model import Aggregate, MetricResult, RepetitionResult

#: Characters XML 1.0 cannot carry, even escaped (stored text may hold any of them).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(value: Any) -> str:
    return _NOT_XML.sub("\ufffd", "" if value is None else str(value))


def _num(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"


def _summary_line(a: Aggregate) -> str:
    ci = a.pass_rate_ci95
    interval = "" if ci is None else f", 95% Wilson [{ci[0]:.3f}, {ci[1]:.3f}]"
    return (f"{a.passed}/{a.n} repetitions passed ({a.verdict}{interval}); gate "
            f"{a.gate}: {a.status}, gate score {_num(a.gate_score)}, threshold "
            f"{_num(a.threshold)}, mean score {_num(a.mean_score)}")


def _rep_line(r: RepetitionResult, m: MetricResult | None) -> str:
    if m is None:
        return f"  repetition {r.repetition}: no unit (inference failed)"
    return (f"  repetition {r.repetition}: {m.status} score {_num(m.score)} (metric "
            f"status {m.metric_status})"
            + (f"; reused from run {m.reused_from_run}" if m.reused else "")
            + (f"; reason: {m.reason}" if m.reason else ""))


def junit_xml(store: Any, record_oid: str, record: EvaluationRecord) -> bytes:
    """The JUnit XML document of ``record`` (UTF-8, with an XML declaration)."""
    result = summary(store, record_oid, record)
    look_up = f"evalsnap show {record.run_id} --store {store.url} --json"
    suite = ET.Element("testsuite", name=_x(record.eval_set_id), timestamp=_x(record.created_at),
                       time="0")
    props = ET.SubElement(suite, "properties")
    for key in ("run_id", "record_id", "snapshot_id", "kind"):
        ET.SubElement(props, "property", name=key, value=_x(getattr(result, key)))
    ET.SubElement(props, "property", name="store", value=_x(store.url))
    counts = {"tests": 0, "failures": 0, "errors": 0}
    covered = {a.eval_id for a in result.aggregates}
    for case in result.cases:
        if case.eval_id in covered or case.metrics:
            continue
        covered.add(case.eval_id)
        tc = ET.SubElement(suite, "testcase", classname=_x(f"{record.eval_set_id}.{case.eval_id}"),
                           name="inference", time="0")
        ET.SubElement(tc, "error", type="inference failed",
                      message="the agent failed on this case; no metric was scored").text = _x(look_up)
        counts["tests"] += 1
        counts["errors"] += 1
    units = {(c.eval_id, c.repetition, name): m
             for c in result.cases for name, m in c.metrics.items()}
    for a in result.aggregates:
        tc = ET.SubElement(suite, "testcase", classname=_x(f"{record.eval_set_id}.{a.eval_id}"),
                           name=_x(a.metric), time="0")
        counts["tests"] += 1
        detail = "\n".join([_summary_line(a)] + [
            _rep_line(r, units.get((a.eval_id, r.repetition, a.metric)))
            for r in a.repetitions] + [look_up])
        if a.status == "NOT_EVALUATED":
            reasons = [m.reason for r in a.repetitions
                       if (m := units.get((a.eval_id, r.repetition, a.metric))) and m.reason]
            ET.SubElement(tc, "error", type="NOT_EVALUATED", message=_x(
                f"{a.incomplete} of {a.n} repetition(s) incomplete"
                + (f": {reasons[0]}" if reasons else ""))).text = _x(detail)
            counts["errors"] += 1
        elif a.status == "FAILED":
            ET.SubElement(tc, "failure", type="FAILED", message=_x(
                f"{a.passed}/{a.n} repetitions passed; gate {a.gate} failed (gate score "
                f"{_num(a.gate_score)}, threshold {_num(a.threshold)})")).text = _x(detail)
            counts["failures"] += 1
        elif a.n > 1:  # a passing case × metric over repetitions: what each one gave
            ET.SubElement(tc, "system-out").text = _x(detail)
    for key, value in counts.items():
        suite.set(key, str(value))
    suite.set("skipped", "0")
    root = ET.Element("testsuites", {"name": "evalsnap", **{k: str(v) for k, v in counts.items()}})
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
