"""``report RECORD --junit FILE``: a record as JUnit XML, for CI systems.

One ``<testsuite>`` per record (named after the eval set) and one ``<testcase>`` per case ×
metric: ``classname`` is ``<eval set>.<eval_id>`` (``#<repetition>`` after the first),
``name`` the metric. A gate ``FAILED`` is a ``<failure>``; a unit that is not complete
(``NOT_EVALUATED``, an errored judge sample, a failed inference) is an ``<error>``, never
``<skipped>``: the run is incomplete (exit 3) and CI must not show it green. ``PASSED`` and
``INFORMATIONAL`` units pass. A case with no unit at all (its inference failed before any
metric) is one ``<testcase name="inference">`` with an ``<error>``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from evalsnap.records import EvaluationRecord
from evalsnap.reports.summary import summary

#: Characters XML 1.0 cannot carry, even escaped (stored text may hold any of them).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(value: Any) -> str:
    return _NOT_XML.sub("\ufffd", "" if value is None else str(value))


def _num(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"


def junit_xml(store: Any, record_oid: str, record: EvaluationRecord) -> bytes:
    """The JUnit XML document of ``record`` (UTF-8, with an XML declaration)."""
    result = summary(store, record_oid, record)
    look_up = f"evalsnap show {record.run_id} --store {store.url} --json"
    suite = ET.Element("testsuite", name=_x(record.eval_set_id), timestamp=_x(record.created_at),
                       time="0")
    props = ET.SubElement(suite, "properties")
    for key in ("run_id", "record_id", "snapshot_id", "kind"):
        ET.SubElement(props, "property", name=key, value=_x(result[key]))
    ET.SubElement(props, "property", name="store", value=_x(store.url))
    counts = {"tests": 0, "failures": 0, "errors": 0}
    for case in result["cases"]:
        classname = f"{record.eval_set_id}.{case['eval_id']}" + (
            f"#{case['repetition']}" if case.get("repetition") else "")
        if not case["metrics"]:
            tc = ET.SubElement(suite, "testcase", classname=_x(classname), name="inference",
                               time="0")
            ET.SubElement(tc, "error", type="inference failed",
                          message="the agent failed on this case; no metric was scored"
                          ).text = _x(look_up)
            counts["tests"] += 1
            counts["errors"] += 1
            continue
        for metric, m in case["metrics"].items():
            tc = ET.SubElement(suite, "testcase", classname=_x(classname), name=_x(metric), time="0")
            counts["tests"] += 1
            detail = (f"score {_num(m['score'])} (metric status {m['metric_status']}), gate score "
                      f"{_num(m['gate_score'])}, threshold {_num(m['threshold'])}"
                      + (f"; reused from run {m['reused_from_run']}" if m["reused"] else "")
                      + (f"; reason: {m['reason']}" if m["reason"] else ""))
            if not m["complete"] or case.get("inference") == "failure":
                ET.SubElement(tc, "error", type=_x(m["status"]),
                              message=_x(m["reason"] or "not evaluated")).text = _x(
                    f"{detail}\n{look_up}")
                counts["errors"] += 1
            elif m["status"] == "FAILED":
                ET.SubElement(tc, "failure", type="FAILED",
                              message=_x(f"score {_num(m['gate_score'])} below threshold "
                                         f"{_num(m['threshold'])}")).text = _x(f"{detail}\n{look_up}")
                counts["failures"] += 1
    for key, value in counts.items():
        suite.set(key, str(value))
    suite.set("skipped", "0")
    root = ET.Element("testsuites", {"name": "evalsnap", **{k: str(v) for k, v in counts.items()}})
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
