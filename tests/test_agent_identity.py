"""Issue 27: the agent identity is complete, stable across processes, and explained.

Every test runs the real CLI on ``tests/fixtures/identity_agents/concierge`` (a copy): an App
with a plugin, an AgentTool whose model and instruction come from the environment, a
sub-agent with a callable instruction, a workflow agent, a function tool, a callback, a
``.env`` with a scenario and a fake key, and a file outside the package that the config
declares (``evalsnapIdentity``). One story of runs on one store, each changing one thing and
reusing what it can (``--reuse``): the cold run in the test process, the first warm one in a
new process with another hash seed, the changes in the test process (as the Python API runs
them, one after the other in one process), and a last warm run in a new process again. Every
read (``explain``, ``diff``, ``show``) is the CLI in the test process (:mod:`tests._cli`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._cli import needs_a_process, ok, run_inproc
from tests.conftest import ROOT, CliResult, copy_agent, run_cli, set_env_value

FIXTURE = Path(__file__).parent / "fixtures" / "identity_agents"
KEY = "sk-concierge-fixture-9Vt3Lq7Xw2Pb5Zn8"
ROTATED = "sk-concierge-fixture-rotated-4Hd8Mw1Qs6"


def copy_project(base: Path) -> Path:
    dst = copy_agent(FIXTURE, base / "identity_agents")
    return dst / "concierge"


# ---- the story: one change at a time ------------------------------------------------------------

@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("identity")
    agent = copy_project(base)
    store, log = base / "store", base / "usage.jsonl"
    env: dict[str, str] = {"CONCIERGE_USAGE_LOG": str(log)}
    runs: dict[str, CliResult] = {}
    explained: dict[str, dict[str, Any]] = {}
    in_process: list[str] = []  # the steps run by the CLI in this process, in order

    def step(name: str, seed: str | None = None, **more_env: str) -> None:
        env.update(more_env)
        args = ("run", str(agent), str(agent / "trip.evalset.json"), "--store", str(store),
                "--json", "--reuse")
        # a seed: a process of its own with that hash seed (the identity must not depend
        # on the process); the other steps run in this process, as the Python API does
        if seed:
            runs[name] = run_cli(*args, env={**env, "PYTHONHASHSEED": seed})
        else:
            runs[name] = run_inproc(*args, env=env)
            if not needs_a_process(args, env):
                in_process.append(name)
        if runs[name].code in (0, 1):
            shown = run_inproc("explain", runs[name].json["run_id"], "--store", str(store),
                               "--json")
            explained[name] = ok(shown)

    step("cold")  # this process: its hash seed is not the warm run's
    cold_usage = log.read_text()
    step("warm", seed=_other_seed("4242"))
    set_env_value(agent / ".env", "PLACES_API_KEY", ROTATED)
    step("rotated")
    step("instruction", PLACES_INSTRUCTION="Suggest hidden places.")
    step("model", PLACES_MODEL="concierge-model-v2")
    set_env_value(agent / ".env", "CONCIERGE_SCENARIO", "beach")
    step("scenario")
    step("workflow", LOOP_MAX="3")
    (agent.parent / "prompts" / "style.md").write_text("Answer briefly.\n")
    step("declared_file")
    step("declared_env", CONCIERGE_STYLE_LEVEL="2")
    source = agent / "agent.py"
    source.write_text(source.read_text().replace('f"Plan a trip for', 'f"Plan a journey for'))
    step("callable")
    step("again", seed=_other_seed("77"))  # the callable's new code, reused in a new process
    text = run_inproc("explain", runs["instruction"].json["run_id"], "--store", str(store))
    diffed = run_inproc("diff", runs["cold"].json["run_id"], runs["instruction"].json["run_id"],
                        "--store", str(store), "--json")
    return {"agent": agent, "store": store, "runs": runs, "explained": explained,
            "explain_text": text, "diff": diffed, "cold_usage": cold_usage,
            "in_process": in_process}


def _other_seed(seed: str) -> str:
    """``seed``, or another one if it is this process's (``PYTHONHASHSEED`` set outside)."""
    import os

    return seed if os.environ.get("PYTHONHASHSEED") != seed else str(int(seed) + 1)


def test_reuse_in_a_new_process_reuses_and_a_key_rotation_too(story: dict[str, Any]) -> None:
    """``cold`` (the test process) and ``warm`` (a new one) are two processes with other hash
    seeds: ``warm`` reusing the inference is the identity being the same in both."""
    assert "warm" not in story["in_process"]
    cold = ok(story["runs"]["cold"])
    assert cold["agent_calls"] == 3  # the root, the AgentTool's agent, the root again
    for name in ("warm", "rotated", "again"):
        out = ok(story["runs"][name])
        assert out["agent_calls"] == 0, name
        assert [c["inference_reused"] for c in out["cases"]] == [True], name


CHANGES = {
    "instruction": "place_agent.instruction",
    "model": "place_agent.model",
    "scenario": ".env CONCIERGE_SCENARIO",
    "workflow": "refine.max_iterations",
    "declared_file": "declared file ../prompts/style.md",
    "declared_env": "declared env CONCIERGE_STYLE_LEVEL",
    "callable": "planner.instruction code",
}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_each_change_reruns_inference_and_explain_names_it(story: dict[str, Any],
                                                           name: str) -> None:
    out = story["runs"][name].json
    assert story["runs"][name].code in (0, 1), story["runs"][name].stderr[-3000:]
    assert out["agent_calls"] == 3, name
    explained = story["explained"][name]
    assert CHANGES[name] in explained["agent_changes"], explained["agent_changes"]
    (inference,) = explained["inferences"]
    assert inference["action"] == "ran" and CHANGES[name] in inference["changes"]
    assert not any("sha256:" in c for c in explained["agent_changes"])


def test_explain_and_diff_say_what_changed_in_words(story: dict[str, Any]) -> None:
    text = story["explain_text"]
    assert text.code == 0, text.stderr[-2000:]
    assert "agent changed: place_agent.instruction" in " ".join(text.stdout.split())
    diffed = ok(story["diff"])
    assert diffed["agent_changes"] == ["place_agent.instruction"]
    (unit,) = diffed["units"]
    assert "inference" in unit["moved"] and unit["agent_changes"] == ["place_agent.instruction"]
    # the scenario switch names the key, and the callback that reads it, never a value
    scenario = story["explained"]["scenario"]["agent_changes"]
    assert "concierge.before_agent_callback code" in scenario
    assert not any("beach" in c or "city" in c for c in scenario)


def test_no_secret_and_no_secret_name_reaches_the_store(story: dict[str, Any]) -> None:
    files = [p for p in story["store"].rglob("*") if p.is_file()]
    assert files
    for needle in (KEY, ROTATED, "PLACES_API_KEY"):
        assert [p for p in files if needle.encode() in p.read_bytes()] == [], needle
        for result in story["runs"].values():
            assert needle not in result.stdout and needle not in result.stderr


def test_tokens_are_every_call_the_model_reported_agent_tool_runs_included(
        story: dict[str, Any]) -> None:
    cold = story["runs"]["cold"].json
    calls = [json.loads(line) for line in story["cold_usage"].splitlines()]
    assert len(calls) == cold["agent_calls"] == 3
    prompt = sum(c["prompt_token_count"] for c in calls)
    answer = sum(c["candidates_token_count"] for c in calls)
    expected = {"input_tokens": prompt, "output_tokens": answer, "total_tokens": prompt + answer,
                "cached_tokens": None, "thoughts_tokens": None}
    assert cold["agent_tokens"] == expected
    assert cold["model_tokens"] == {"concierge-model-v1": expected}
    (case,) = cold["cases"]
    assert case["tokens"] == expected and case["tokens_by_model"] == {"concierge-model-v1": expected}
    # ADK's own token_usage_v1 stays ADK's: the parent session's events only
    assert case["efficiency"]["token_usage_v1"]["value"] < prompt + answer


# ---- stable in every process ----------------------------------------------------------------------

PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from evalsnap.agents.lanes import load_agent
found = {}
for agent_dir in sys.argv[2:]:
    agent = load_agent(agent_dir)
    found[agent_dir] = {"identity": agent.identity, "manifest": agent.manifest}
print(json.dumps(found, sort_keys=True))
"""


def _probe(agent_dirs: list[Path], seed: str) -> dict[str, Any]:
    """The identity and manifest of each agent, loaded in that order in one fresh process."""
    proc = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "examples"),
                           *map(str, agent_dirs)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**_clean_env(), "PYTHONHASHSEED": seed})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PLACES_", "CONCIERGE_", "LOOP_"))}


def _has_langgraph() -> bool:
    import importlib.util

    return importlib.util.find_spec("langgraph") is not None


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, dict]]:
    """Each agent's ``(first, second)`` probe: two fresh processes, other hash seeds (set
    order), and the agents loaded in the opposite order in the second."""
    base = tmp_path_factory.mktemp("probe")
    agents = {"concierge": copy_project(base)}
    if _has_langgraph():
        agents["langgraph"] = base / "langgraph_agent"
        copy_agent(ROOT / "examples" / "langgraph_agent", agents["langgraph"])
    dirs = list(agents.values())
    first, second = _probe(dirs, "1"), _probe(dirs[::-1], "4242")
    return {name: (first[str(d)], second[str(d)]) for name, d in agents.items()}


def test_the_same_agent_has_the_same_identity_in_two_fresh_processes(probes) -> None:
    first, second = probes["concierge"]
    assert first == second
    tree = first["manifest"]["tree"]
    planner = next(a for a in tree["sub_agents"] if a["agent"] == "planner")
    assert planner["instruction"]["callable"] == "concierge.agent.planner_instruction"
    assert planner["instruction"]["code"].startswith("sha256:")
    place = next(t for t in tree["tools"] if t["tool"] == "place_agent")
    assert place["agent"]["agent"] == "place_agent" and place["skip_summarization"] is False
    assert " at 0x" not in json.dumps(first["manifest"])  # no repr anywhere
    assert first["manifest"]["env"].keys() == {"CONCIERGE_SCENARIO"}  # the key is left out
    assert [p["name"] for p in first["manifest"]["app"]["plugins"]] == ["audit"]


def test_the_langgraph_lane_identity_is_the_same_in_two_fresh_processes(probes) -> None:
    pytest.importorskip("langgraph")
    first, second = probes["langgraph"]
    assert first == second and first["manifest"]["framework"] == "langgraph"
    nodes = {n["id"]: n["runs"] for n in first["manifest"]["graph"]["nodes"]}
    assert nodes["agent"]["code"].startswith("sha256:")


# ---- set-up errors and config ---------------------------------------------------------------------

def test_an_empty_app_name_fails_at_once_with_adks_message(tmp_path: Path) -> None:
    from evalsnap.records import repo

    agent = copy_project(tmp_path)
    evalset = json.loads((agent / "trip.evalset.json").read_text())
    evalset["eval_cases"][0]["session_input"] = {"appName": "", "userId": "u", "state": {}}
    path = agent / "empty_app.evalset.json"
    path.write_text(json.dumps(evalset))
    store = tmp_path / "store"
    result = run_inproc("run", str(agent), str(path), "--store", str(store), "--json",
                     env={"EVALSNAP_RETRIES": "2", "EVALSNAP_RETRY_DELAYS": "5,5"})
    out = ok(result, code=3)
    assert out["agent_calls"] == 0
    shown = ok(run_inproc("show", out["run_id"], "--store", str(store), "--json"))
    (case,) = shown["cases"]
    assert "app_name is required" in case["inference"]["error"]
    assert "Session not found" not in case["inference"]["error"]
    assert case["inference"]["attempts"] == 1  # not retried: no retry delay was waited
    record = repo.get_inference(repo.open_store(str(store)), case["inference"]["inference_oid"])
    assert record.retryable is False and "Traceback" in (record.traceback or "")


BAD_IDENTITY = {
    "secret_env": ({"env": ["PLACES_API_KEY"]}, "PLACES_API_KEY"),
    "no_such_file": ({"files": ["../nowhere/*.md"]}, "../nowhere/*.md"),
    "not_a_list": ({"env": "CONCIERGE_STYLE_LEVEL"}, "evalsnapIdentity.env"),
    "unknown_key": ({"modules": ["x"]}, "evalsnapIdentity.modules"),
}


@pytest.mark.parametrize("name", sorted(BAD_IDENTITY))
def test_a_bad_evalsnap_identity_entry_is_exit_2_naming_it(tmp_path: Path, name: str) -> None:
    agent = copy_project(tmp_path)
    config = json.loads((agent / "test_config.json").read_text())
    config["evalsnapIdentity"], expected = BAD_IDENTITY[name]
    (agent / "test_config.json").write_text(json.dumps(config))
    result = run_inproc("run", str(agent), str(agent / "trip.evalset.json"), "--store",
                     str(tmp_path / "store"))
    assert result.code == 2, result.stderr[-2000:]
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "store" / "v1" / "objects").exists()


@pytest.mark.parametrize("threshold", [-0.5, 1.5])
def test_a_threshold_outside_the_metric_range_is_exit_2(tmp_path: Path, threshold: float) -> None:
    """Issue 29 item 10: ADK's metric info gives response_match_score the range [0, 1]."""
    agent = copy_project(tmp_path)
    (agent / "test_config.json").write_text(json.dumps(
        {"criteria": {"response_match_score": threshold}}))
    result = run_inproc("run", str(agent), str(agent / "trip.evalset.json"), "--store",
                     str(tmp_path / "store"))
    assert result.code == 2, result.stderr[-2000:]
    assert "response_match_score" in result.stderr and "outside the metric's range" in result.stderr
    assert "[0, 1]" in result.stderr


def test_one_process_runs_the_agent_it_fingerprinted(story: dict[str, Any]) -> None:
    """Two runs in one process (the Python API's case), the agent edited between them: the
    second run's inference is made by the edited agent and explained as such (an earlier run's
    agent, kept by the process, once ran under the new key). In the story: ``declared_env``
    ran the agent in this process, ``agent.py`` was edited, then ``callable`` ran here too."""
    import os

    if os.environ.get("EVALSNAP_TEST_CLI") == "process":
        pytest.skip("EVALSNAP_TEST_CLI=process: every CLI call runs in a process of its own")
    steps = story["in_process"]
    assert "callable" in steps and steps[steps.index("callable") - 1] == "declared_env", steps
    assert ok(story["runs"]["declared_env"])["agent_calls"] == 3  # it loaded and ran the agent
    second = ok(story["runs"]["callable"])
    assert second["agent_calls"] == 3
    explained = story["explained"]["callable"]
    assert "planner.instruction code" in explained["agent_changes"], explained["agent_changes"]
