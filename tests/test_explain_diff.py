"""``explain``, ``diff`` and ``ls`` over records made by the real CLI.

Record A (``run``) scores everything (five of the demo's cases). Record B (``run --reuse``) changes one thing per input:
the reference of ``weather_unknown_city``, the agent output of ``weather_two_cities``, the threshold
of ``response_match_score`` and the version of the custom metric. Record C (``rescore B
--reuse --force``) scores B's inputs again. Every command runs through the real CLI in the
test process (:mod:`tests._cli`).

How the agent "answers differently" for one case without changing the agent: the agent copy's
``get_weather`` tool reads a test hook from the environment (present in A's agent already, so
the agent identity never changes). Run X, under another eval set id (so it is nobody's
parent) and a throwaway rule (so its units cannot be reused), runs the agent on
``weather_two_cities`` with the hook set: a new successful inference of the same inference
fingerprint, now the latest in the inference index, which B then reuses. Prefect's task cache is
cleared before B (it is only a cache) so that B's inference comes from evalsnap's index.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from evalsnap.records import repo
from tests._cli import run_inproc
from tests.conftest import CliResult, copy_shop

CHANGED_INFERENCE = "weather_two_cities"
CHANGED_REFERENCE = "weather_unknown_city"
"""Not weather_paris: its user turn is the same as weather_paris_stale_reference's, so both share
one inference fingerprint, and a --reuse run may take the other case's copy of the same answer
(another object, whose volatile fields differ; `diff` then lists "inference" as moved too)."""
HOOK = "EVALSNAP_TEST_WEATHER_OVERRIDE"
#: The cases A, B and C run (``--case``; how many is not the point): the two changed ones, one
#: that only the rule changes move, one whose response_match_score passes at 0.5 and fails at
#: 0.99 (a status flip), and the demo's case with an incomplete unit (scored again by B).
CASES = [CHANGED_INFERENCE, CHANGED_REFERENCE, "cart_add_two_items", "cart_show_prefilled",
         "out_of_scope_flight"]
CASE_ARGS = [a for c in CASES for a in ("--case", c)]
WIDE = {"COLUMNS": "250"}  # tables for people: wide enough that no cell wraps


def _patch_tools(agent: Path) -> None:
    tools = agent / "tools.py"
    text = tools.read_text("utf-8")
    anchor = "    known = KNOWN_CITIES.get(city.strip().lower())\n"
    assert anchor in text, "expected get_weather to look the city up in KNOWN_CITIES"
    hook = (f"    import os\n    _name, _, _value = os.environ.get({HOOK!r}, '').partition('=')\n"
            "    if _name and _name == city.strip().lower():  # test hook: 'city=condition,temp'\n"
            "        _condition, _temp = _value.split(',')\n"
            "        return {'status': 'ok', 'city': city, 'condition': _condition,\n"
            "                'temperature_c': int(_temp)}\n")
    tools.write_text(text.replace(anchor, hook + anchor), "utf-8")


def _json(r: CliResult, what: str) -> dict[str, Any]:
    assert r.code in (0, 1, 3), f"expected {what} to succeed, got {r.code}: {r.stderr[-3000:]}"
    return r.json


class Rec:
    def __init__(self, url: str, out: dict[str, Any]) -> None:
        self.json = out
        self.record_oid = out["record_id"]
        self.snapshot_oid = out["snapshot_id"]
        oid, self.record = repo.resolve_record(repo.open_store(url), out["run_id"])
        assert oid == self.record_oid, "expected --json record_id to be the stored record"


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("explain")
    agent = copy_shop(root / "agents" / "shop_agent")
    _patch_tools(agent)
    store = root / "store"
    url = str(store)
    evalset = agent / "shop.evalset.json"
    config = json.loads((agent / "test_config.json").read_text("utf-8"))
    eval_set = json.loads(evalset.read_text("utf-8"))

    a = Rec(url, _json(run_inproc("run", str(agent), str(evalset), "--store", url, "--json",
                                  *CASE_ARGS), "A"))
    assert {i.eval_id for i in a.record.inference} == set(CASES)

    # X: the agent answers differently for one case (same inference fingerprint)
    refresh = {"eval_set_id": "shop_refresh",
               "eval_cases": [c for c in eval_set["eval_cases"]
                              if c["eval_id"] == CHANGED_INFERENCE]}
    (agent / "refresh.evalset.json").write_text(json.dumps(refresh), "utf-8")
    throwaway = {"criteria": {"tool_trajectory_avg_score": 0.123}}
    if config.get("evalsnapPlugins"):
        throwaway["evalsnapPlugins"] = config["evalsnapPlugins"]
    (root / "throwaway.json").write_text(json.dumps(throwaway), "utf-8")
    x = Rec(url, _json(run_inproc("run", str(agent), str(agent / "refresh.evalset.json"),
                               "--config", str(root / "throwaway.json"), "--store", url,
                               "--json", env={HOOK: "tokyo=snowy,-3"}), "X"))
    assert x.json["agent_calls"] > 0, "expected X to run the agent"
    shutil.rmtree(store / "v1" / "prefect", ignore_errors=True)

    edited_config = copy.deepcopy(config)
    edited_config["criteria"]["response_match_score"] = 0.99
    edited_config["customMetrics"]["response_mentions_city"]["version"] = "2"
    (root / "edited_config.json").write_text(json.dumps(edited_config), "utf-8")
    edited = copy.deepcopy(eval_set)
    for case in edited["eval_cases"]:
        if case["eval_id"] == CHANGED_REFERENCE:
            case["conversation"][-1]["final_response"]["parts"] = [
                {"text": "Atlantis: no data, sorry."}]
    (agent / "edited.evalset.json").write_text(json.dumps(edited), "utf-8")
    b = Rec(url, _json(run_inproc("run", str(agent), str(agent / "edited.evalset.json"),
                               "--config", str(root / "edited_config.json"), "--store", url,
                               "--reuse", "--json", *CASE_ARGS), "B"))
    assert b.json["agent_calls"] == 0, "expected B to reuse every inference"
    changed = next(i for i in b.record.inference if i.eval_id == CHANGED_INFERENCE)
    assert changed.inference_oid == next(i.inference_oid for i in x.record.inference), \
        "expected B to use X's inference of the changed case (the latest in the index)"
    c = Rec(url, _json(run_inproc("rescore", b.json["run_id"], "--store", url,
                               "--evalset", str(agent / "edited.evalset.json"),
                               "--config", str(root / "edited_config.json"),
                               "--code-path", str(agent.parent), "--reuse", "--force",
                               "--json"), "C"))
    return {"url": url, "a": a, "x": x, "b": b, "c": c}


def _by_key(units: list[dict]) -> dict[tuple[str, str], dict]:
    return {(u["eval_id"], u["metric"]): u for u in units}


def _cli_json(*args: str, url: str) -> dict[str, Any]:
    r = run_inproc(*args, "--store", url, "--json")
    assert r.code == 0, f"expected `{' '.join(args)}` to exit 0, got {r.code}: {r.stderr[-3000:]}"
    return r.json


def test_explain_names_the_reason_of_every_unit(records) -> None:
    url = records["url"]
    a, b, c = records["a"], records["b"], records["c"]
    ea = _cli_json("explain", a.record_oid, url=url)
    assert {u["why"] for u in ea["units"]} == {"reuse not requested"}, \
        "expected every unit of A to say 'reuse not requested'"
    assert ea["scored_units"] == len(a.record.units) and ea["reused_units"] == 0, \
        "expected A to score every unit"

    eb = _cli_json("explain", b.record_oid, url=url)
    assert eb["parent_record"] == a.record_oid, "expected A as B's parent"
    units = _by_key(eb["units"])
    incomplete = {k for k, u in _by_key(ea["units"]).items() if not u["complete"]}
    for (case, metric), u in units.items():
        if metric == "response_match_score":
            assert u["why"] == "rule changed" and "rule" in u["moved_vs_parent"], (case, u)
        elif metric == "response_mentions_city":
            assert u["why"] == "evaluator version changed", (case, u["why"])
        elif case == CHANGED_REFERENCE:
            assert u["why"] == "reference changed" and u["moved_vs_parent"] == ["case"], u
        elif case == CHANGED_INFERENCE:
            assert u["why"] == "inference changed" and u["moved_vs_parent"] == ["case"], u
        elif (case, metric) in incomplete:
            assert u["why"] == "incomplete before" and u["action"] == "scored", u
        else:
            assert u["action"] == "reused" and u["why"] == "reused", (case, metric)
            assert u["reused_from_record"] == a.record_oid, f"expected {case}/{metric} from A"
            assert u["reused_from_run"] == a.record.run_id, f"expected {case}/{metric} from A's run"
            assert u["moved_vs_parent"] == [], f"expected nothing moved for {case}/{metric}"
    assert eb["why_counts"]["reused"] == eb["reused_units"], "expected the counts to agree"

    ec = _cli_json("explain", c.record_oid, url=url)
    assert {u["why"] for u in ec["units"]} == {"forced"} and ec["parent_record"] == b.record_oid, \
        "expected C forced, with B as parent"


def test_diff_names_the_input_that_moved(records) -> None:
    url = records["url"]
    a, b, c = records["a"], records["b"], records["c"]
    d = _cli_json("diff", a.record_oid, b.record_oid, url=url)
    units = _by_key(d["units"])
    assert units[(CHANGED_REFERENCE, "tool_trajectory_avg_score")]["moved"] == ["reference"]
    assert units[(CHANGED_INFERENCE, "tool_trajectory_avg_score")]["moved"] == ["inference"]
    assert units[(CHANGED_REFERENCE, "response_match_score")]["moved"] == ["reference", "rule"]
    rms = units[("cart_add_two_items", "response_match_score")]
    assert rms["moved"] == ["rule"] and "threshold 0.5 → 0.99" in rms["rule_changes"], rms
    city = units[("cart_add_two_items", "response_mentions_city")]
    assert city["moved"] == ["rule"] and city["rule_changes"] == ["evaluator identity"], city
    same = units[("cart_add_two_items", "tool_trajectory_avg_score")]
    assert same["same_unit"] and same["change"] == "none" and same["moved"] == [], same
    # the stricter threshold turns at least one pass into a failure, and diff says so
    flipped = [u for u in d["units"] if u["metric"] == "response_match_score"
               and u["status_a"] == "PASSED" and u["status_b"] == "FAILED"]
    assert flipped and all(u["change"] == "status" for u in flipped), \
        "expected a PASSED → FAILED flip reported as a status change"
    # the changed answer no longer matches its reference
    inf = units[(CHANGED_INFERENCE, "response_match_score")]
    assert inf["score_b"] < inf["score_a"], f"expected a lower score for the changed answer: {inf}"
    # forcing the same inputs moves nothing and changes no score
    same_inputs = _cli_json("diff", b.record_oid, c.record_oid, url=url)
    assert {u["change"] for u in same_inputs["units"]} == {"none"}, "expected no change B → C"
    assert all(u["same_unit"] for u in same_inputs["units"]), "expected the same unit keys B → C"


def test_cli_explain_diff_ls(records) -> None:
    url, a, x, b, c = (records[k] for k in ("url", "a", "x", "b", "c"))
    out = _cli_json("explain", b.record.run_id, url=url)
    assert out["record_id"] == b.record_oid, "expected explain by run id to find B"
    assert len(out["units"]) == len(b.record.units), "expected one entry per unit"

    r = run_inproc("explain", b.record_oid, "--store", url, env=WIDE)  # a table for people
    assert r.code == 0 and "reference changed" in r.stdout and "reused" in r.stdout, r.stdout

    out = _cli_json("diff", a.record.run_id, b.record_oid[:20], url=url)
    assert (out["record_a"], out["record_b"]) == (a.record_oid, b.record_oid), \
        "expected diff to resolve a run id and an id prefix"
    assert out["changes"]["none"] > 0, "expected unchanged units counted"

    r = run_inproc("diff", a.record_oid, b.record_oid, "--store", url, env=WIDE)
    assert r.code == 0 and "reference" in r.stdout and "inference" in r.stdout, r.stdout

    out = _cli_json("ls", url=url)
    newest_first = [c, b, x, a]
    assert [r["run_id"] for r in out["runs"]] == [v.record.run_id for v in newest_first], \
        "expected runs newest first"
    assert [r["record_id"] for r in out["records"]] == [v.record_oid for v in newest_first], \
        "expected records newest first"
    assert {s["snapshot_id"] for s in out["snapshots"]} == {v.snapshot_oid for v in newest_first}
    r = run_inproc("ls", "--store", url, env=WIDE)
    assert r.code == 0, r.stderr
    assert all(v.record.run_id in r.stdout for v in newest_first), r.stdout


def test_cli_diff_unknown_record_exits_2(records) -> None:
    r = run_inproc("diff", "latest", "not-a-run", "--store", records["url"])
    assert r.code == 2, f"expected exit 2 for an unknown record, got {r.code}"
    said = " ".join((r.stdout + r.stderr).split())
    assert "not-a-run" in said and "evalsnap ls" in said, said



def test_the_previous_records_units_are_found_by_key_as_a_dict_finds_them():
    """publish explains a changed unit by the previous record's unit of the same key, looked
    up by its 16-byte key and read from the record's rows (not a dict of every parsed unit,
    ~150 MB at 30,000 cases): the same unit a dict would give, the last of a key's."""
    from evalsnap.pipeline.publish import _ParentUnits
    from evalsnap.records import UnitRef
    from evalsnap.rows import Rows

    def ref(i: int, metric: str, why: str = "new") -> UnitRef:
        return UnitRef(eval_id=f"case-{i % 50}", repetition=i // 50, metric_name=metric,
                       unit_oid="sha256:" + f"{i:064x}", unit_fingerprint=f"u{i}",
                       case_fingerprint=f"c{i}", rule_fingerprint=f"r{metric}", reused=False,
                       why=why)

    refs = [ref(i, m) for i in range(120) for m in ("a", "b")] + [ref(7, "a", "again")]
    rows = Rows(UnitRef, refs)
    as_dict = {(u.eval_id, u.repetition, u.metric_name): u for u in refs}
    found = _ParentUnits(rows)
    for key, unit in as_dict.items():
        assert found.get(key) == unit
    assert found.get(("case-7", 0, "a")).why == "again"
    assert found.get(("case-7", 0, "c")) is None and found.get(("case-99", 0, "a")) is None
