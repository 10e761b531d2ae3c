"""Which eval sets and cases a run covers, named the way ``adk eval`` and
``AgentEvaluator.evaluate`` name them.

A target is one of:

* ``FILE`` or ``FILE:ID,ID`` — an eval set file, optionally only some of its cases
  (``adk eval``'s own parser, :func:`google.adk.cli.cli_eval.parse_and_get_evals_to_run`);
* ``EVAL_SET_ID[:ID,ID]`` — an eval set of the agent's folder
  (``AGENT_DIR/<id>.evalset.json``, as ``adk eval`` resolves ids with its
  ``LocalEvalSetsManager``);
* ``DIR`` — every ``*.test.json`` below it, as ``AgentEvaluator.evaluate`` finds them.

Each target is scored with ``--config`` when given, else with the ``test_config.json``
of its own folder (ADK's default criteria where there is none).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from google.adk.cli.cli_eval import parse_and_get_evals_to_run
from google.adk.evaluation.local_eval_sets_manager import LocalEvalSetsManager

from evalsnap.errors import InputFileError, UsageError

_EVAL_SET_SUFFIX = ".evalset.json"
_TEST_FILE_SUFFIX = ".test.json"


@dataclass(frozen=True)
class EvalTarget:
    """One eval set file of a run and what of it to run."""

    path: Path
    case_ids: list[str] = field(default_factory=list)
    """Cases named after ``FILE:``; empty means every case (or ``--case``)."""
    config_path: Path | None = None
    """The config it is scored with; None means ADK's default criteria."""


def default_config_path(evalset: str | Path) -> Path | None:
    """``test_config.json`` beside the eval set, as ``adk eval`` and ``AgentEvaluator`` do."""
    candidate = Path(evalset).parent / "test_config.json"
    return candidate if candidate.is_file() else None


def _test_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob(f"*{_TEST_FILE_SUFFIX}") if p.is_file())


def _eval_set_ids(agent_dir: Path) -> list[str]:
    return sorted(p.name.removesuffix(_EVAL_SET_SUFFIX) for p in agent_dir.glob(f"*{_EVAL_SET_SUFFIX}"))


def _by_id(agent_dir: Path, eval_set_id: str) -> Path:
    manager = LocalEvalSetsManager(agents_dir=str(agent_dir.parent))
    try:
        path = Path(manager._get_eval_set_file_path(agent_dir.name, eval_set_id))  # noqa: SLF001
    except ValueError as exc:  # ADK's path-segment check: "a/b", "..", ...
        raise InputFileError(f"eval set {eval_set_id!r} is neither a file nor an eval set id "
                             f"({exc}); pass an .evalset.json path.") from exc
    if not path.is_file():
        known = _eval_set_ids(agent_dir)
        raise InputFileError(
            f"eval set {eval_set_id} does not exist: it is not a file, and {agent_dir} has no "
            f"{eval_set_id}{_EVAL_SET_SUFFIX}; pass an eval set file, a directory of "
            f"*{_TEST_FILE_SUFFIX} files, or one of the agent's eval set ids "
            f"({', '.join(known) or 'it has none'}).")
    return path


def resolve_targets(agent_dir: Path, specs: list[str], config: str | Path | None
                    ) -> list[EvalTarget]:
    """The eval set files of a run, in the order given, each with its selection and config."""
    if not specs:
        raise UsageError("no eval set given; pass an .evalset.json file, FILE:ID,ID, an eval "
                         "set id of the agent, or a directory of *.test.json files.")
    targets: list[EvalTarget] = []
    for spec, case_ids in parse_and_get_evals_to_run(list(specs)).items():
        path = Path(spec)
        if path.is_dir():
            if case_ids:
                raise UsageError(f"{spec}:{','.join(case_ids)} selects cases of a directory; "
                                 "select cases of one file (FILE:ID,ID) or use --case.")
            files = _test_files(path)
            if not files:
                raise InputFileError(f"{path} holds no *{_TEST_FILE_SUFFIX} file; pass an eval "
                                     "set file or a directory of test files.")
        elif path.is_file():
            files = [path]
        elif os.sep in spec or "/" in spec or spec.endswith(".json"):
            raise InputFileError(f"eval set {path} does not exist; pass the path of an "
                                 f".evalset.json file (optionally FILE:ID,ID).")
        else:
            files = [_by_id(agent_dir, spec)]
        targets += [EvalTarget(path=f, case_ids=list(dict.fromkeys(case_ids)),
                               config_path=Path(config) if config else default_config_path(f))
                    for f in files]
    seen: dict[Path, EvalTarget] = {}
    for target in targets:
        key = target.path.resolve()
        if key in seen:
            raise UsageError(f"eval set {target.path} is named twice; name it once "
                             "(FILE:ID,ID selects several cases).")
        seen[key] = target
    return targets
