"""A pytest helper that mirrors ADK's ``AgentEvaluator.evaluate``.

::

    from evalsnap.testing import assert_agent_passes

    def test_home_automation():
        assert_agent_passes("tests.fixture.home_automation_agent",
                            "tests/fixture/home_automation_agent/simple_test.test.json",
                            num_runs=2)

It runs ``evalsnap.evaluate`` (so every score is published and auditable in the store) and
fails the test with one readable line per case × metric that did not pass. Bad input
(a malformed eval set, an unknown metric) raises its typed error as usual.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from evalsnap.api import RunResult, evaluate
from evalsnap.errors import AgentLoadError

__all__ = ["agent_dir_of", "assert_agent_passes", "problems"]


def agent_dir_of(agent_module: str | Path) -> Path:
    """The package directory of ``agent_module``: a directory, or an importable module name
    as ``AgentEvaluator`` takes it (``tests.fixture.my_agent``)."""
    path = Path(agent_module)
    if path.is_dir():
        return path
    try:
        spec = importlib.util.find_spec(str(agent_module))
    except (ImportError, ValueError) as exc:
        raise AgentLoadError(f"agent module {agent_module!r} cannot be found ({exc}); pass the "
                             "agent package's directory or an importable module name.") from exc
    if spec is None or not spec.submodule_search_locations:
        raise AgentLoadError(f"agent module {agent_module!r} is not an importable package; pass "
                             "the directory of an ADK agent package (with __init__.py).")
    return Path(next(iter(spec.submodule_search_locations)))


def problems(result: RunResult) -> list[str]:
    """One line per case × metric that did not pass its repetition gate (ADK's rule by
    default: the mean over all repetitions), and per failed inference."""
    lines = []
    for run in result.runs:
        lines += [f"{run.eval_set_id}/{c.eval_id}" + (f" #{c.repetition}" if c.repetition else "")
                  + ": inference failed" for c in run.cases if c.inference == "failure"]
        for a in run.aggregates:
            if a.status == "PASSED":
                continue
            score = "no score" if a.gate_score is None else f"mean score {a.gate_score:.3f}"
            need = "" if a.threshold is None else f", threshold {a.threshold:g}"
            lines.append(f"{run.eval_set_id}/{a.eval_id} · {a.metric}: {a.status} "
                         f"({score}{need}; {a.passed}/{a.n} repetitions passed)")
    return lines


def assert_agent_passes(agent_module: str | Path, eval_dataset_file_path_or_dir: str | Path, *,
                        num_runs: int = 1, agent_name: str | None = None,
                        initial_session_file: str | Path | None = None,
                        config: str | Path | None = None, store: str | None = None,
                        reuse: bool = False) -> RunResult:
    """Evaluates the agent as ``AgentEvaluator.evaluate`` does and raises ``AssertionError``
    naming every case × metric that did not pass (or could not be scored); with
    ``num_runs`` > 1 a case × metric passes, as in ``AgentEvaluator``, when the mean of its
    per-invocation scores over all runs reaches the threshold.

    ``num_runs`` is the number of repetitions of each case, ``agent_name`` a sub-agent to
    evaluate instead of the root agent, ``initial_session_file`` the session state of
    old-format ``*.test.json`` files. A directory is searched for ``*.test.json`` files, each
    scored with the ``test_config.json`` of its own folder. Returns the result when it passed.
    """
    result = evaluate(str(agent_dir_of(agent_module)), str(eval_dataset_file_path_or_dir),
                      config=str(config) if config else None, store=store, reuse=reuse,
                      repetitions=num_runs, agent_name=agent_name,
                      initial_session_file=str(initial_session_file)
                      if initial_session_file else None)
    if not result.passed:
        verdict = "is incomplete" if not result.complete else "did not pass"
        records = ", ".join(f"{r.eval_set_id}: record {r.record_id}" for r in result.runs)
        lines = "\n".join(f"  - {line}" for line in problems(result))
        raise AssertionError(f"the evaluation {verdict} ({records}; `evalsnap show` and "
                             f"`evalsnap explain` tell more):\n{lines}")
    return result
