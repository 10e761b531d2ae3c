"""Issue 28: repetitions read together, through the real CLI, on a scripted flaky agent.

The agent (``tests/fixtures/flaky_agent``) passes its cases 5, 3, 1 and 0 of every 5
repetitions; ``response_match_score`` at 0.5 scores each repetition 1.0 or 0.0. Every
statistic is checked against an independent computation here (``math.comb``, a
hand-written Wilson interval and Fisher test), and the default gate against ADK's own
``AgentEvaluator`` case by case.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests._cli import run_inproc

FIXTURE = Path(__file__).parent / "fixtures" / "flaky_agent"
PASSES = {"always": 5, "mostly": 3, "rarely": 1, "never": 0}
TEXT = "{}: pass={}/5 what colour is the sky?"
Z = 1.959963984540054  # the 97.5% normal quantile


def wilson(k: int, n: int) -> tuple[float, float]:
    """The Wilson score interval, by its formula."""
    p = k / n
    denom = 1 + Z * Z / n
    centre = (p + Z * Z / (2 * n)) / denom
    half = Z / denom * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def test_the_wilson_interval_is_scipys_to_the_bit() -> None:
    from scipy.stats import binomtest

    from evalsnap.aggregates import wilson as ours

    for n in range(1, 61):
        for k in range(n + 1):
            ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
            assert ours(k, n) == [float(ci.low), float(ci.high)], (k, n)
            assert ours(k, n) == pytest.approx(list(wilson(k, n)), abs=1e-12)
    assert ours(0, 0) is None


def fisher_two_sided(a: int, b: int, c: int, d: int) -> float:
    """Fisher's exact test on [[a, b], [c, d]]: the tables with the same margins that are at
    most as likely as the observed one."""
    row, col, n = a + b, a + c, a + b + c + d

    def prob(x: int) -> float:
        return math.comb(col, x) * math.comb(n - col, row - x) / math.comb(n, row)

    observed = prob(a)
    return sum(prob(x) for x in range(max(0, row + col - n), min(row, col) + 1)
               if prob(x) <= observed * (1 + 1e-7))


@pytest.fixture
def flaky(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A copy of the flaky agent (its ADK history copy lands there), importable as
    ``flaky_agent`` for ADK's AgentEvaluator, with fresh call counts."""
    root = tmp_path / "agents"
    shutil.copytree(FIXTURE, root / "flaky_agent")
    monkeypatch.syspath_prepend(str(root))
    from flaky_agent import agent

    agent.reset()
    yield {"agent": root / "flaky_agent", "evalset": root / "flaky_agent" / "flaky.evalset.json",
           "store": tmp_path / "store", "module": agent}
    agent.reset()


def _run(flaky, *extra: str):
    return run_inproc("run", str(flaky["agent"]), str(flaky["evalset"]),
                      "--store", str(flaky["store"]), "--json", *extra)


@pytest.fixture(scope="module")
def five_reps(tmp_path_factory: pytest.TempPathFactory):
    """One cold ``run --repetitions 5`` (its own copy of the agent, counts from zero), shared:
    each test that starts from one gets a copy of its store (:func:`after_five`)."""
    root = tmp_path_factory.mktemp("five-reps") / "agents"
    shutil.copytree(FIXTURE, root / "flaky_agent")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        from flaky_agent import agent

        agent.reset()
        store = root.parent / "store"
        r = run_inproc("run", str(root / "flaky_agent"),
                       str(root / "flaky_agent" / "flaky.evalset.json"),
                       "--store", str(store), "--json", "--repetitions", "5")
        calls = agent.calls()
        agent.reset()
    return {"result": r, "store": store, "calls": calls}


@pytest.fixture
def after_five(flaky, five_reps):
    """``flaky`` whose store holds the shared cold run of 5 repetitions; its CliResult."""
    shutil.copytree(five_reps["store"], flaky["store"])
    return five_reps["result"]


def _aggs(result: dict) -> dict[str, dict]:
    return {a["eval_id"]: a for a in result["aggregates"]}


def _adk_passes(flaky, eval_id: str, num_runs: int) -> bool:
    """ADK's own AgentEvaluator on one case of the eval set, ``num_runs`` runs."""
    from google.adk.evaluation.agent_evaluator import AgentEvaluator
    from google.adk.evaluation.eval_config import EvalConfig
    from google.adk.evaluation.eval_set import EvalSet

    eval_set = EvalSet.model_validate_json(flaky["evalset"].read_text("utf-8"))
    eval_set = eval_set.model_copy(update={"eval_cases": [
        c for c in eval_set.eval_cases if c.eval_id == eval_id]})
    config = EvalConfig.model_validate_json((flaky["agent"] / "test_config.json").read_text("utf-8"))
    try:
        asyncio.run(AgentEvaluator.evaluate_eval_set(
            agent_module="flaky_agent", eval_set=eval_set, eval_config=config,
            num_runs=num_runs, print_detailed_results=False))
    except AssertionError:
        return False
    return True


def test_aggregates_statistics_and_adk_gate(flaky, after_five, five_reps, tmp_path: Path):
    r = after_five  # run --repetitions 5, cold
    assert r.code == 1, r.stderr[-3000:]
    result = r.json
    assert result["agent_calls"] == 20 and result["repetition_gate"] == "mean"
    assert five_reps["calls"] == 20  # the scripted model saw each of them
    assert not result["passed"] and result["exit_code"] == 1
    aggs = _aggs(result)
    assert set(aggs) == set(PASSES)
    for eval_id, c in PASSES.items():
        a = aggs[eval_id]
        assert a["metric"] == "response_match_score"
        assert (a["n"], a["passed"], a["failed"], a["incomplete"]) == (5, c, 5 - c, 0)
        assert a["pass_rate"] == pytest.approx(c / 5)
        assert a["pass_rate_ci95"] == pytest.approx(list(wilson(c, 5)), abs=1e-9)
        assert a["mean_score"] == pytest.approx(c / 5)
        scores = [1.0] * c + [0.0] * (5 - c)
        mean = sum(scores) / 5
        assert a["score_stdev"] == pytest.approx(
            math.sqrt(sum((s - mean) ** 2 for s in scores) / 4))
        for k in range(1, 6):
            assert a["pass_at_k"][str(k)] == pytest.approx(
                1 - math.comb(5 - c, k) / math.comb(5, k))
            assert a["pass_hat_k"][str(k)] == pytest.approx(math.comb(c, k) / math.comb(5, k))
        assert a["verdict"] == {5: "passing", 0: "failing"}.get(c, "flaky")
        # the default gate: the mean of all repetitions' per-invocation scores vs 0.5
        assert a["status"] == ("PASSED" if c / 5 >= 0.5 else "FAILED")
    # ADK's own AgentEvaluator agrees case by case (its own inference, the same script)
    flaky["module"].reset()
    adk = {eval_id: _adk_passes(flaky, eval_id, 5) for eval_id in PASSES}
    assert adk == {e: aggs[e]["status"] == "PASSED" for e in PASSES}
    assert adk == {"always": True, "mostly": True, "rarely": False, "never": False}

    # the score table: one row per case × metric with k/n and the interval
    shown = run_inproc("show", result["run_id"], "--store", str(flaky["store"]))
    assert shown.code == 0, shown.stderr[-2000:]
    assert "3/5" in shown.stdout and "[0.23, 0.88]" in shown.stdout
    assert "flaky" in shown.stdout and "gate mean" in shown.stdout
    detail = run_inproc("show", result["run_id"], "--store", str(flaky["store"]), "--all")
    assert "mostly #4" in detail.stdout
    full = run_inproc("show", result["run_id"], "--store", str(flaky["store"]), "--json").json
    assert {a["eval_id"]: a["passed"] for a in full["aggregates"]} == PASSES

    # JUnit: one test case per case × metric, its repetitions in the text
    out = tmp_path / "junit.xml"
    rep = run_inproc("report", result["run_id"], "--junit", str(out), "--store", str(flaky["store"]))
    assert rep.code == 0, rep.stderr[-2000:]
    suite = ET.parse(out).getroot().find("testsuite")
    cases = {tc.get("classname").rsplit(".", 1)[-1]: tc for tc in suite.findall("testcase")}
    assert len(suite.findall("testcase")) == 4 and suite.get("failures") == "2"
    assert cases["rarely"].find("failure") is not None
    assert cases["mostly"].find("failure") is None
    text = cases["mostly"].find("system-out").text
    assert "3/5 repetitions passed (flaky" in text and text.count("  repetition ") == 5


def test_gate_choices_reuse_every_unit(flaky, after_five):
    first = after_five  # run --repetitions 5, cold
    assert first.code == 1
    calls = flaky["module"].calls()
    expected = {"every": {"always"}, "rate:0.6": {"always", "mostly"},
                "rate:0.2": {"always", "mostly", "rarely"}, "mean": {"always", "mostly"}}
    for gate, passing in expected.items():
        r = _run(flaky, "--repetitions", "5", "--reuse", "--repetition-gate", gate)
        result = r.json
        assert (result["agent_calls"], result["judge_calls"], result["scored_units"]) == (0, 0, 0)
        assert result["reused_units"] == 20 and result["repetition_gate"] == gate
        assert {a["eval_id"] for a in result["aggregates"] if a["status"] == "PASSED"} == passing
        assert r.code == 1 and not result["passed"]
    assert flaky["module"].calls() == calls  # not one model call more
    only = run_inproc("run", str(flaky["agent"]), str(flaky["evalset"]) + ":always,mostly",
                      "--store", str(flaky["store"]), "--json", "--repetitions", "5", "--reuse",
                      "--repetition-gate", "rate:0.6")
    assert only.code == 0 and only.json["passed"]
    # the stored record says so too (history, diff and the run's events read it): a unit of
    # "mostly" failed, yet the case × metric passed its gate
    stored = run_inproc("show", only.json["run_id"], "--store", str(flaky["store"]), "--json")
    assert stored.json["record"]["summary"]["passed"] is True
    rescored = run_inproc("rescore", first.json["run_id"], "--store", str(flaky["store"]),
                          "--reuse", "--repetition-gate", "every", "--json")
    assert rescored.json["scored_units"] == 0 and rescored.json["repetition_gate"] == "every"
    assert _aggs(rescored.json)["mostly"]["status"] == "FAILED"
    bad = _run(flaky, "--repetition-gate", "rate:2")
    assert bad.code == 2 and "--repetition-gate" in bad.stderr


def test_assert_agent_passes_follows_adk_mean_rule(flaky):
    from evalsnap.testing import assert_agent_passes

    with pytest.raises(AssertionError) as caught:
        assert_agent_passes(flaky["agent"], flaky["evalset"], num_runs=5,
                            store=str(flaky["store"]))
    message = str(caught.value)
    assert "rarely · response_match_score" in message and "never · response_match_score" in message
    assert "mostly" not in message and "always" not in message  # 3 of 5: mean 0.6 passes


def test_more_repetitions_run_only_the_new_ones(flaky, after_five):
    assert after_five.code == 1  # run --repetitions 5, cold
    flaky["module"].reset()
    r = _run(flaky, "--repetitions", "7", "--reuse")
    result = r.json
    assert result["agent_calls"] == 4 * 2 and flaky["module"].calls() == 8
    reused = {(c["eval_id"], c["repetition"]): c["inference_reused"] for c in result["cases"]}
    assert all(reused[(e, rep)] for e in PASSES for rep in range(5))
    assert not any(reused[(e, rep)] for e in PASSES for rep in (5, 6))
    # the new repetitions' units are ordinary units (identical answers score as one unit)
    assert result["reused_units"] + result["scored_units"] == 28
    units = {(c["eval_id"], c["repetition"]): c["metrics"]["response_match_score"]
             for c in result["cases"]}
    assert all(units[(e, rep)]["reused"] for e in PASSES for rep in range(5))
    assert {a["eval_id"]: a["n"] for a in result["aggregates"]} == dict.fromkeys(PASSES, 7)


def test_regressions_are_not_noise(flaky, after_five):
    base = after_five.json  # run --repetitions 5, cold
    overrides = flaky["module"].state().override

    # tonight the 3-of-5 case drew 2 of 5: a drop, but within noise
    overrides[TEXT.format("mostly", 3)] = (2, 5)
    r = _run(flaky, "--repetitions", "5", "--baseline", base["run_id"], "--fail-on", "regression")
    assert r.code == 0, r.stderr[-3000:]
    [reg] = r.json["regressions"]
    assert (reg["eval_id"], reg["passed_before"], reg["passed_after"]) == ("mostly", 3, 2)
    assert reg["p_value"] == pytest.approx(fisher_two_sided(3, 2, 2, 3)) == pytest.approx(1.0)
    assert reg["significant"] is False and "within noise" in reg["change"]

    # and the always-passing case broke: 5 of 5 → 0 of 5 is significant (p ≈ 0.0079)
    overrides[TEXT.format("always", 5)] = (0, 5)
    r = _run(flaky, "--repetitions", "5", "--baseline", base["run_id"], "--fail-on", "regression")
    assert r.code == 1
    regs = {e["eval_id"]: e for e in r.json["regressions"]}
    assert regs["always"]["p_value"] == pytest.approx(fisher_two_sided(5, 0, 0, 5))
    assert regs["always"]["p_value"] == pytest.approx(2 / math.comb(10, 5), rel=1e-9)
    assert regs["always"]["significant"] and not regs["mostly"]["significant"]
    assert "REGRESSED" in r.stderr and "always" in r.stderr
    # a stricter alpha makes even 5/5 → 0/5 noise
    strict = _run(flaky, "--repetitions", "5", "--baseline", base["run_id"],
                  "--fail-on", "regression", "--alpha", "0.005")
    assert strict.code == 0 and not any(e["significant"] for e in strict.json["regressions"])

    # the mean score difference per metric, with a seeded paired bootstrap interval
    [delta] = r.json["metric_deltas"]
    before = {e: c / 5 for e, c in PASSES.items()}
    after = before | {"mostly": 0.4, "always": 0.0}
    diffs = [after[e] - before[e] for e in PASSES]
    assert delta["metric"] == "response_match_score" and delta["cases"] == 4
    assert delta["mean_delta"] == pytest.approx(sum(diffs) / 4)
    low, high = delta["ci95"]
    assert min(diffs) <= low <= delta["mean_delta"] <= high <= max(diffs)
    assert delta["excludes_zero"] == (low > 0 or high < 0)
    from evalsnap.reports.regressions import compare

    again = compare(r.json, base, 0.0, 0.05)["metric_deltas"][0]
    assert again["ci95"] == delta["ci95"]  # the same records give the same interval
    assert json.dumps(again) == json.dumps(delta)


@pytest.mark.parametrize("shift", [0.0, 0.1, -1 / 3])
def test_identical_differences_give_the_bootstrap_interval_without_resampling(shift):
    """A rerun whose differences are all equal (nothing moved, or everything by the same
    amount) gets the interval scipy's bootstrap finds for it, without its 9,999 resamples;
    other differences still go through the bootstrap."""
    import numpy as np
    from scipy.stats import bootstrap

    from evalsnap.reports.regressions import SEED, metric_deltas

    def entries(scores):
        return [{"eval_id": f"c{i}", "metric": "m", "mean_score": s} for i, s in enumerate(scores)]

    before = [0.2, 0.5, 0.9, 0.4]
    for after in ([b + shift for b in before], [0.3, 0.5, 0.6, 0.4]):
        [delta] = metric_deltas(entries(after), entries(before))
        res = bootstrap((np.array(before), np.array(after)),
                        lambda u, v, axis=-1: np.mean(v - u, axis=axis), paired=True,
                        vectorized=True, n_resamples=9999, confidence_level=0.95,
                        method="percentile", rng=np.random.default_rng(SEED))
        assert delta["ci95"] == [float(res.confidence_interval.low),
                                 float(res.confidence_interval.high)]


def test_history_flaky_lists_cases_whose_status_flipped(flaky):
    evalset = str(flaky["evalset"]) + ":always,mostly"
    overrides = flaky["module"].state().override

    def run() -> dict:
        return run_inproc("run", str(flaky["agent"]), evalset, "--store", str(flaky["store"]),
                          "--json", "--repetitions", "5").json

    statuses = []
    for script in (None, (2, 5), None):  # mostly: 3/5 (mean 0.6), 2/5 (0.4), 3/5 again
        overrides.pop(TEXT.format("mostly", 3), None)
        if script:
            overrides[TEXT.format("mostly", 3)] = script
        statuses.append(_aggs(run())["mostly"]["status"])
    assert statuses == ["PASSED", "FAILED", "PASSED"]
    r = run_inproc("history", "flaky", "--store", str(flaky["store"]), "--flaky", "--json")
    assert r.code == 0, r.stderr[-2000:]
    [entry] = r.json["flaky"]  # "always" never flipped
    assert (entry["eval_id"], entry["flips"], entry["passed_runs"], entry["runs"]) == (
        "mostly", 2, 2, 3)
    assert [h["status"] for h in entry["history"]] == statuses
    table = run_inproc("history", "flaky", "--store", str(flaky["store"]), "--flaky")
    assert "mostly" in table.stdout and "always" not in table.stdout
    last2 = run_inproc("history", "flaky", "--store", str(flaky["store"]), "--flaky", "--last",
                       "2", "--json").json
    assert [e["flips"] for e in last2["flaky"]] == [1]


def test_until_stable_spends_repetitions_only_where_the_doubt_is(flaky, after_five, tmp_path):
    """``--until-stable 15`` after the shared 5 repetitions (reused): the 5/5 and 0/5 cases
    are settled (their Wilson interval does not hold the threshold 0.5), the 3/5 and 1/5
    cases get 5 more per round; ``rarely`` settles at 3/15 ([0.07, 0.45]), ``mostly`` is
    still in doubt at 9/15 ([0.36, 0.80]) and stops at the maximum."""
    assert after_five.code == 1  # run --repetitions 5, cold
    flaky["module"].reset()
    r = _run(flaky, "--repetitions", "5", "--until-stable", "15", "--reuse")
    assert r.code == 1, r.stderr[-3000:]
    result = r.json
    assert result["agent_calls"] == 20 and flaky["module"].calls() == 20  # 10 more for 2 cases
    aggs = _aggs(result)
    assert {e: (a["passed"], a["n"]) for e, a in aggs.items()} == {
        "always": (5, 5), "mostly": (9, 15), "rarely": (3, 15), "never": (0, 5)}
    for a in aggs.values():
        assert a["pass_rate_ci95"] == pytest.approx(list(wilson(a["passed"], a["n"])), abs=1e-9)
    stability = result["coverage"]["stability"]
    assert result["coverage"]["until_stable"] == 15 and result["coverage"]["full"] is True
    assert {e: (s["repetitions"], s["stopped"]) for e, s in stability.items()} == {
        "always": (5, "stable"), "mostly": (15, "max"), "rarely": (15, "stable"),
        "never": (5, "stable")}
    assert aggs["mostly"]["status"] == "PASSED" and aggs["rarely"]["status"] == "FAILED"
    # the added repetitions are ordinary units: the same run again reuses every one of them
    again = _run(flaky, "--repetitions", "5", "--until-stable", "15", "--reuse")
    assert (again.json["agent_calls"], again.json["scored_units"]) == (0, 0)
    assert again.json["reused_units"] == 40 and again.json["coverage"]["stability"] == stability
    table = run_inproc("show", result["run_id"], "--store", str(flaky["store"]))
    assert "until stable (≤ 15): 1 at max, 3 stable" in " ".join(table.stdout.split())
    below = _run(flaky, "--repetitions", "5", "--until-stable", "3")
    assert below.code == 2 and "--until-stable 3 is below --repetitions 5" in below.stderr

    # the report: one row per case × metric with k/n, the interval and a flaky badge
    from tests.test_report_browser import CHROMIUM, browse

    page = flaky["store"] / "v1" / "refs" / "reports" / (
        result["record_id"].removeprefix("sha256:") + ".html")
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    dom, console = browse(page.as_uri(), "--dump-dom", tmp=tmp_path)
    assert console == [], console
    rows = _aggregate_rows(dom)
    assert set(rows) == set(PASSES)
    for eval_id, a in aggs.items():
        row = rows[eval_id]
        low, high = a["pass_rate_ci95"]
        assert (int(row["passed"]), int(row["n"])) == (a["passed"], a["n"])
        assert (row["ci_low"], row["ci_high"]) == (f"{low:.2f}", f"{high:.2f}")
        assert row["verdict"] == a["verdict"] and row["status"] == a["status"]
        assert row["stopped"] == "{repetitions} ({stopped})".format(**stability[eval_id])
    assert rows["mostly"]["verdict_class"] == "badge flaky"


def _aggregate_rows(dom: str) -> dict[str, dict[str, str]]:
    """``data-aggregate`` rows of the rendered page: each ``data-stat`` cell's text (and
    the verdict badge's class)."""
    from html.parser import HTMLParser

    rows: dict[str, dict[str, str]] = {}

    class Rows(HTMLParser):
        row: str | None = None
        stat: str | None = None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "tr":
                self.row = a.get("data-aggregate")
                if self.row:
                    rows[self.row] = {}
            elif self.row and a.get("data-stat"):
                self.stat = a["data-stat"]
                rows[self.row][self.stat] = ""
                if self.stat == "verdict":
                    rows[self.row]["verdict_class"] = a.get("class", "")

        def handle_endtag(self, tag):
            if tag in ("span", "td"):
                self.stat = None
            if tag == "tr":
                self.row = None

        def handle_data(self, data):
            if self.row and self.stat:
                rows[self.row][self.stat] += data.strip()

    Rows().feed(dom)
    return rows


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-10, 10),
                min_size=1, max_size=4))
def test_the_mean_is_statistics_mean(values):
    """A gate's mean (``aggregates._mean``) is ``statistics.mean``, value and type: one float
    is taken as it is, anything else is averaged by ``statistics``."""
    import statistics

    from evalsnap.aggregates import _mean

    expected = statistics.mean(values)
    assert _mean(values) == expected and type(_mean(values)) is type(expected)
