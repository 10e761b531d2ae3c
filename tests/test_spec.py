"""Issue 26 item 1: one :class:`RunSpec`, built by each front door, passed down whole.

The flows' flat parameters (the UI's form), the spec and the command line's options must
name the same options: a spec's :meth:`~RunSpec.flow_parameters` are exactly its flow's
parameters, and :meth:`~RunSpec.of_flow` gives the same spec back from them.
"""

from __future__ import annotations

import inspect

import pytest

from evalsnap.spec import RunOptions, RunSpec, new_run_id
from flows.evaluate import evaluate
from flows.rescore import rescore

RUN = RunSpec(kind="run", agent_dir="/a/agent", evalsets=["/a/x.evalset.json", "/a/y.json:c1"],
              config="/a/test_config.json", store="s3://bucket/p", reuse=True, force=False,
              metrics=["response_match_score"], cases=["c1", "c2"], repetitions=3, until_stable=9,
              agent_name="sub", initial_session_file="/a/initial.session.json",
              baseline="latest", tolerance=0.1, alpha=0.01, repetition_gate="rate:0.8",
              fail_on="regression", framework="langgraph", concurrency=4, task_runner="dask",
              dask_address="tcp://h:8786")
RESCORE = RunSpec(kind="rescore", source="latest", evalsets=["/a/edited.evalset.json"],
                  config="/a/test_config.json", store="/tmp/store", reuse=True,
                  code_paths=["/a", "/b"], agent_dir="/a/agent", agent_name="sub",
                  metrics=None, cases=["c1"], baseline=None, fail_on="never",
                  repetition_gate="every", task_runner="threads")


@pytest.mark.parametrize(("spec", "flow"), [(RUN, evaluate), (RESCORE, rescore)],
                         ids=["run", "rescore"])
def test_flow_parameters_are_the_flows_and_read_back_whole(spec: RunSpec, flow) -> None:
    params = spec.flow_parameters()
    assert set(params) == set(inspect.signature(flow.fn).parameters)
    # validated as Prefect validates a flow run's parameters (what the UI's form posts)
    validated = flow.validate_parameters(params)
    assert RunSpec.of_flow(spec.kind, **validated) == spec


def test_the_forms_empty_values_are_the_specs_defaults() -> None:
    form = evaluate.validate_parameters({"agent_dir": "agent", "evalset": "x.evalset.json"})
    spec = RunSpec.of_flow("run", **form)
    assert spec == RunSpec(kind="run", agent_dir="agent", evalsets=["x.evalset.json"])
    assert spec.baseline is None and spec.metrics is None and spec.task_runner is None
    form = rescore.validate_parameters({"run_or_snapshot": "latest", "metrics": "a, b,"})
    spec = RunSpec.of_flow("rescore", **form)
    assert spec.metrics == ["a", "b"] and spec.evalsets == [] and spec.agent_dir is None
    assert spec.reuse is True  # the rescore form's default, kept


def test_a_spec_is_frozen_and_refuses_unknown_options() -> None:
    with pytest.raises(ValueError):
        RunSpec(kind="run", repetitons=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        RUN.reuse = False  # type: ignore[misc]
    with pytest.raises(ValueError):
        RunSpec(fail_on="sometimes")  # type: ignore[arg-type]


def test_run_options_of_a_spec_are_new_runs() -> None:
    first, second = RUN.run_options(), RUN.run_options()
    assert first.run_id != second.run_id
    assert first.model_dump(exclude={"run_id"}) == RunOptions(
        kind="run", reuse=True, force=False, concurrency=4).model_dump(exclude={"run_id"})
    stamp, _, token = new_run_id().partition("Z-")
    assert len(stamp) == 15 and stamp[8] == "T" and len(token) == 6


def test_the_command_line_names_every_option_of_the_spec() -> None:
    """A new spec field needs a CLI option (or is said here to have none)."""
    from evalsnap.cli._app import rescore as rescore_cmd
    from evalsnap.cli._app import run as run_cmd

    cli_names = {"agent_dir": "agent_dir", "evalsets": "evalset", "metrics": "metric",
                 "cases": "case", "source": "run_or_snapshot", "code_paths": "code_path"}
    run_params = set(inspect.signature(run_cmd).parameters)
    rescore_params = set(inspect.signature(rescore_cmd).parameters) | {"agent_dir"}
    for name in RunSpec.model_fields:
        if name in ("kind", "concurrency"):  # the command chooses; concurrency: the default
            continue
        option = cli_names.get(name, name)
        assert option in run_params | rescore_params, f"no CLI option for RunSpec.{name}"
