"""Loading ADK eval sets with errors that name the file and what to fix."""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.adk.evaluation.agent_evaluator import ALLOWED_CRITERIA, AgentEvaluator
from google.adk.evaluation.eval_case import EvalCase
from google.adk.evaluation.eval_config import EvalConfig
from google.adk.evaluation.eval_set import EvalSet
from google.adk.evaluation.local_eval_sets_manager import convert_eval_set_to_pydantic_schema
from pydantic import ValidationError

from evalsnap.errors import ConfigError, EvalSetError, InputFileError
from evalsnap.jsonsafe import (
    needs_whole_check,
    scan_object,
    strict_json,  # re-exported: evalsnap.adk.evalset.strict_json
)
from evalsnap.rows import Rows


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"{err.get('msg')} at `{loc}`" if loc else str(err.get("msg"))


def _parse_json(text: str, where: str) -> Any:
    try:
        return strict_json(text)
    except json.JSONDecodeError as exc:
        raise EvalSetError(
            f"{where} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "fix the file, or regenerate it with `adk web`."
        ) from exc
    except ValueError as exc:
        raise EvalSetError(f"{where} is not valid JSON: {exc}; fix the file.") from exc


def _eval_set_from_object(raw: Any, where: str) -> EvalSet:
    if not isinstance(raw, dict):
        raise EvalSetError(
            f"{where} must hold an ADK EvalSet object with `eval_set_id` and `eval_cases`, "
            f"not a JSON {type(raw).__name__}."
        )
    _check_spellings(raw, where)
    try:
        eval_set = EvalSet.model_validate(raw)
    except ValidationError as exc:
        raise EvalSetError(
            f"{where} is not a valid ADK eval set: {_first_error(exc)}. "
            "See ADK's EvalSet format (eval_set_id, eval_cases[].conversation)."
        ) from exc
    _check_cases(eval_set, where)
    return eval_set


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


#: Values that are the user's own data (session state, tool arguments and results), where
#: ``user_id`` beside ``userId`` may well be meant.
_FREE_FORM = frozenset({"state", "args", "response", "final_session_state", "finalSessionState",
                        "custom_metadata", "customMetadata", "tool_input"})


def _check_spellings(raw: Any, where: str) -> None:
    """ADK's models accept a field under its name and its camelCase alias (``eval_id`` and
    ``evalId``); an object that gives both is ambiguous — which one ADK keeps, and which one a
    selection or a fingerprint reads, can differ — so it is an error naming both."""
    stack: list[tuple[Any, str]] = [(raw, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, list):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(value))
            continue
        if not isinstance(value, dict):
            continue
        for key, item in value.items():
            alias = _camel(key) if isinstance(key, str) and "_" in key else key
            if alias != key and alias in value:
                at = f" at `{path}`" if path else ""
                raise EvalSetError(f"{where}: `{key}` and `{alias}` are both given{at}; they are "
                                   "one field spelled two ways — keep one of them.")
            if key not in _FREE_FORM:
                stack.append((item, f"{path}.{key}" if path else str(key)))


def parse_eval_set(text: str, *, where: str) -> EvalSet:
    """Parses and checks an eval set object; raises ``EvalSetError`` naming ``where``.

    Text alone is always the current ``EvalSet`` format: ADK's old list formats need the
    file (its name, its sibling ``test_config.json`` and ``initial.session.json``), so
    only :func:`load_eval_set` migrates them."""
    return _eval_set_from_object(_parse_json(text, where), where)


def _check_cases(eval_set: EvalSet, where: str) -> None:
    checks = _CaseChecks(where)
    for case in eval_set.eval_cases:
        checks.add(case)
    checks.done()


@dataclass
class _CaseChecks:
    """The checks of an eval set's cases, taken one case at a time (:meth:`add`), raised in
    one order whatever the cases' (:meth:`done`): duplicate eval_ids, eval_ids that differ
    only in their Unicode form, then the first case without a conversation or user content."""

    where: str
    ids: list[str] = field(default_factory=list)
    problem: str | None = None

    def add(self, case: EvalCase) -> None:
        self.ids.append(case.eval_id)
        if self.problem is None:
            self.problem = _case_problem(case, self.where)

    def done(self) -> None:
        where = self.where
        dupes = [k for k, n in Counter(self.ids).items() if n > 1]
        if dupes:
            raise EvalSetError(
                f"{where} has duplicate eval_id(s) {', '.join(sorted(dupes))}; "
                "every case needs a unique eval_id (cases are matched by it)."
            )
        # the same characters, composed differently (NFC "café" and NFD "cafe\u0301"), look
        # alike in every report: refused as duplicates, never silently normalized
        by_form = Counter(unicodedata.normalize("NFC", i) for i in self.ids)
        alike = sorted(repr(i) for i in self.ids if by_form[unicodedata.normalize("NFC", i)] > 1)
        if alike:
            raise EvalSetError(
                f"{where} has eval_ids that differ only in their Unicode normalization "
                f"({', '.join(alike)}): they look identical in reports; write them the same way "
                "(NFC) or rename one."
            )
        if self.problem is not None:
            raise EvalSetError(self.problem)


def _case_problem(case: EvalCase, where: str) -> str | None:
    if case.conversation is None and case.conversation_scenario is None:
        return (f"{where}: case {case.eval_id!r} has neither `conversation` nor "
                "`conversation_scenario`; add the expected turns.")
    for index, invocation in enumerate(case.conversation or []):
        parts = invocation.user_content.parts or []
        if not any((p.text or "").strip() or p.inline_data or p.file_data for p in parts):
            return (f"{where}: case {case.eval_id!r} turn {index} has no user content; "
                    "give every invocation a `user_content` with text.")
    return None


@dataclass
class EvalCases:
    """An eval set as a run holds it: its header (an ``EvalSet`` without cases), its cases as
    rows (each case's JSON, past a few MB in a temporary file: 30,000 cases as ADK models
    were ~200 MB held from planning to freeze), and their eval_ids in order."""

    header: EvalSet
    cases: Rows[EvalCase]
    ids: list[str]

    @classmethod
    def of(cls, eval_set: EvalSet) -> EvalCases:
        """An ``EvalSet`` as rows (a migrated old format, a rescore's frozen references)."""
        return cls(eval_set.model_copy(update={"eval_cases": []}),
                   Rows(EvalCase, eval_set.eval_cases), [c.eval_id for c in eval_set.eval_cases])

    @property
    def eval_set_id(self) -> str:
        return self.header.eval_set_id

    def selected(self, wanted: Iterable[str]) -> Rows[EvalCase]:
        """The cases of ``wanted`` eval_ids, in the eval set's order (their JSON as it is)."""
        keep = set(wanted)
        return Rows.of_json(EvalCase, (data for i, data in zip(self.ids, self.cases.json_items(),
                                                               strict=True) if i in keep))

    def release(self) -> None:
        """Lets the cases go (their ids stay)."""
        self.cases.clear()


def _cases_from_object(raw: Any, where: str, text: str) -> EvalCases:
    """:func:`_eval_set_from_object`, a case at a time: each raw case is let go once it is a
    row. Anything it refuses is refused by the one strict parse of ``text``, so that the
    error is the same as ever."""
    items = raw.get("eval_cases") if isinstance(raw, dict) else None
    if not isinstance(items, list):
        return EvalCases.of(_eval_set_from_object(raw, where))
    _check_spellings(raw, where)
    checks = _CaseChecks(where)

    def each() -> Iterator[EvalCase]:
        for i, item in enumerate(items):
            items[i] = None
            case = EvalCase.model_validate(item)
            checks.add(case)
            yield case

    try:
        header = EvalSet.model_validate({**raw, "eval_cases": []})
        rows = Rows(EvalCase, each())
    except ValidationError:  # the one strict parse of the text: the same error as ever
        return EvalCases.of(_eval_set_from_object(_parse_json(text, where), where))
    checks.done()
    return EvalCases(header, rows, checks.ids)


def load_eval_set(path: str | Path, *, initial_session: dict[str, Any] | None = None
                  ) -> EvalSet:
    """Reads an eval set file as ``adk eval`` / ``AgentEvaluator`` read it.

    * a JSON object: ADK's ``EvalSet`` (``.evalset.json``);
    * a JSON list: one of ADK's old formats, migrated by ADK's own code, with stable ids
      (:func:`migrate_old_format`).

    ``initial_session`` is ``AgentEvaluator.evaluate``'s ``initial_session_file`` content
    (:func:`load_initial_session`): the session of an old ``.test.json``. None means the
    :data:`INITIAL_SESSION_FILE` beside the file, if there is one. As in ADK, an ``EvalSet``
    file holds its own ``session_input`` and refuses one.

    Either way the cases pass the same checks (unique eval_ids, user content in every turn).
    """
    p, text, raw = _read(path, initial_session)
    return _eval_set_from_object(raw, str(p)) if not isinstance(raw, list) \
        else _migrated(p, raw, initial_session)


def load_eval_cases(path: str | Path, *, initial_session: dict[str, Any] | None = None
                    ) -> EvalCases:
    """:func:`load_eval_set`, as a run holds it (:class:`EvalCases`): the same checks, the
    same errors, the cases as rows."""
    p = Path(path)
    text = _read_text(p)
    streamed = None if initial_session else _cases_streamed(text, str(p))
    if streamed is not None:
        return streamed
    raw = _parse_json(text, str(p))
    if not isinstance(raw, list):
        _refuse_initial_session(initial_session, f"{p} is an ADK EvalSet file")
        return _cases_from_object(raw, str(p), text)
    return EvalCases.of(_migrated(p, raw, initial_session))


#: Cases validated, then added to the rows, at a time.
_ROWS_BATCH = 256


def _cases_streamed(text: str, where: str) -> EvalCases | None:
    """An eval set object read a case at a time from its text
    (:func:`~evalsnap.jsonsafe.scan_object`): each case parsed, checked and made a row
    before the next is parsed (the whole file parsed at once was ~10 times its size in
    objects, ~300 MB at 30,000 cases, whose freed memory the run kept). None for anything
    that is not a plain eval set object whose cases all pass: the one strict read of the
    text then says what is wrong, as ever."""
    if needs_whole_check(text):
        return None
    rows: Rows[EvalCase] = Rows(EvalCase)
    checks = _CaseChecks(where)

    def take(items: Iterator[tuple[Any, str]]) -> list[Any]:
        batch: list[EvalCase] = []
        for item, _ in items:
            _check_spellings(item, where)
            batch.append(case := EvalCase.model_validate(item))
            checks.add(case)
            if len(batch) >= _ROWS_BATCH:
                rows.extend(batch)
                batch.clear()
        rows.extend(batch)
        return []  # the header's: an EvalSet without its cases

    try:
        head = scan_object(text, {"eval_cases": take})
        if "eval_cases" not in head:
            return None
        _check_spellings(head, where)
        header = EvalSet.model_validate(head)
        checks.done()
    except (ValueError, IndexError, RecursionError, ValidationError, EvalSetError):
        return None
    return EvalCases(header, rows, checks.ids)


def _read_text(p: Path) -> str:
    if not p.is_file():
        raise InputFileError(f"eval set {p} does not exist; pass the path of an .evalset.json file.")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"cannot read eval set {p}: {exc}") from exc


def _read(path: str | Path, initial_session: dict[str, Any] | None) -> tuple[Path, str, Any]:
    """The file, its text and its JSON (an ``EvalSet`` object refuses an initial session)."""
    p = Path(path)
    text = _read_text(p)
    raw = _parse_json(text, str(p))
    if not isinstance(raw, list):
        _refuse_initial_session(initial_session, f"{p} is an ADK EvalSet file")
    return p, text, raw


def _migrated(p: Path, raw: list[Any], initial_session: dict[str, Any] | None) -> EvalSet:
    eval_set = migrate_old_format(p, raw, initial_session)
    _check_cases(eval_set, str(p))
    return eval_set


def load_initial_session(path: str | Path | None) -> dict[str, Any] | None:
    """An ``initial_session_file`` (``AgentEvaluator.evaluate``'s): ``{"app_name", "user_id",
    "state"}``, applied to every old-format ``.test.json`` of a run. None without a file."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"initial session file {p} does not exist; pass a JSON file "
                             "{\"app_name\", \"user_id\", \"state\"}, or leave it out.")
    return _read_session(p, f"initial session file {p}")


def _refuse_initial_session(initial_session: dict[str, Any] | None, what: str) -> None:
    if initial_session:
        raise EvalSetError(f"{what}, which holds its own initial sessions; an initial session "
                           "file only applies to ADK's old .test.json files: leave it out, or "
                           "move the state into the cases' `session_input`.")


# ---- ADK's old list formats ---------------------------------------------------------------

INITIAL_SESSION_FILE = "initial.session.json"
"""The initial session of a ``.test.json`` beside it (``AgentEvaluator``'s
``initial_session_file``): ``{"app_name", "user_id", "state"}``."""
_SUFFIXES = (".test.json", ".evalset.json", ".json")
_TURN_SHAPE = ('{"query": "...", "expected_tool_use": [{"tool_name": "...", "tool_input": {}}], '
               '"reference": "..."}')
_OLD_FORMAT = (f"A JSON list is read as ADK's old .test.json format (a list of turns {_TURN_SHAPE}); "
               "otherwise the file must hold an ADK EvalSet object with `eval_set_id` and "
               "`eval_cases` (ADK's `AgentEvaluator.migrate_eval_data_to_new_schema` converts "
               "old files).")


def migrate_old_format(path: Path, raw: list[Any],
                       initial_session: dict[str, Any] | None = None) -> EvalSet:
    """One of ADK's old list formats, converted by ADK's own code, with stable ids.

    * ``[{"query", "expected_tool_use", "reference", ...}, ...]`` (a ``.test.json``): the turns
      of one conversation, converted by ``AgentEvaluator._get_eval_set_from_old_format``, the
      migration ``AgentEvaluator.evaluate`` and ``migrate_eval_data_to_new_schema`` run: its
      columns are checked against the ``test_config.json`` beside it (ADK's default criteria
      without one); its initial session is ``initial_session``, else the
      :data:`INITIAL_SESSION_FILE` beside it.
    * ``[{"name", "data", "initial_session"}, ...]`` (an old ``.evalset.json``): one case per
      entry, converted by ``convert_eval_set_to_pydantic_schema`` as ``adk eval`` does.

    ADK fills in a random eval_set_id (uuid4) and invocation ids, clock-time timestamps, and the
    file path as a test file's eval_id. evalsnap matches cases by eval_id across runs and stores
    the reference cases content-addressed, so these are replaced by values that only depend on
    the file: eval_set_id (and name) is the file name without ``.test.json`` /
    ``.evalset.json`` / ``.json``; eval_id is that same stem for a test file (its one case) and
    the entry's ``name`` for an old eval set; invocation_id is ``<eval_id>-<turn index>``;
    every creation_timestamp is 0.0.
    """
    where = str(path)
    set_id = _stem(path)
    if raw and all(isinstance(entry, dict) and "data" in entry for entry in raw):
        _refuse_initial_session(initial_session, f"{where} is an old ADK eval set (entries "
                                "with `name` and `data`)")
        converted = _from_old_eval_set(raw, set_id, where)
        return _with_stable_ids(converted, set_id, [str(entry["name"]) for entry in raw])
    _check_turns(raw, where, "")
    session = initial_session if initial_session is not None else _sibling_session(path)
    return _with_stable_ids(_from_test_file(path, where, session), set_id, [set_id])


def _stem(path: Path) -> str:
    name = path.name
    stem = next((name[: -len(s)] for s in _SUFFIXES if name.endswith(s)), path.stem)
    if not stem:
        raise EvalSetError(f"{path} has no name before its suffix, and its eval_set_id is its "
                           "name; rename the file, e.g. to my_agent.test.json.")
    return stem


def _from_test_file(path: Path, where: str, initial_session: dict[str, Any]) -> EvalSet:
    try:
        return AgentEvaluator._get_eval_set_from_old_format(  # noqa: SLF001 (ADK's migration)
            where, _config_to_check(path), initial_session)
    except OSError as exc:
        raise InputFileError(f"cannot read eval set {where}: {exc}") from exc
    except ValueError as exc:  # ADK's column check (pydantic's ValidationError included)
        detail = str(exc).split(" The sample is", 1)[0]
        raise EvalSetError(
            f"{where}: ADK's migration of its old .test.json format refused it: {detail} "
            "Give the turns the keys the criteria need, or drop the metric from the "
            "test_config.json beside the file (without one, ADK's default criteria "
            "tool_trajectory_avg_score and response_match_score apply)."
        ) from exc


def _config_to_check(path: Path) -> EvalConfig:
    """The config ADK checks an old test file's columns against: the ``test_config.json``
    beside it (``AgentEvaluator.find_config_for_test_file``), ADK's own criteria only. ADK
    refuses any other criterion in an old file; evalsnap scores more (custom and evalsnap
    metrics), and the config itself is checked in full when it is loaded for scoring."""
    try:
        eval_config = AgentEvaluator.find_config_for_test_file(str(path))
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        detail = _first_error(exc) if isinstance(exc, ValidationError) else str(exc)
        raise ConfigError(
            f"{path.parent / 'test_config.json'} (the config of the old-format test file "
            f"{path}) is not a valid ADK test config: {detail}; fix it."
        ) from exc
    criteria = {k: v for k, v in eval_config.criteria.items() if k in ALLOWED_CRITERIA}
    return eval_config.model_copy(update={"criteria": criteria})


def _from_old_eval_set(raw: list[Any], set_id: str, where: str) -> EvalSet:
    for index, entry in enumerate(raw):
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise EvalSetError(f"{where}: entry {index} has no `name` string; in ADK's old eval "
                               "set format every entry is {\"name\", \"data\", \"initial_session\"} "
                               "and its name becomes the eval_id.")
        _check_turns(entry["data"], where, f"case {name!r} ")
        session = entry.get("initial_session", {})
        if not isinstance(session, dict):
            raise EvalSetError(f"{where}: case {name!r} `initial_session` must be an object "
                               "{\"app_name\", \"user_id\", \"state\"}.")
        _check_session(session, f"{where}: case {name!r} `initial_session`")
    try:
        return convert_eval_set_to_pydantic_schema(eval_set_id=set_id,
                                                   eval_set_in_json_format=raw)
    except ValueError as exc:  # pydantic's ValidationError: a value ADK's models refuse
        raise EvalSetError(f"{where}: ADK's migration of its old eval set format refused it: "
                           f"{exc}; fix the entry it names.") from exc


def _check_turns(turns: Any, where: str, case: str) -> None:
    """What ADK's converter indexes into, checked first so that no KeyError escapes it."""
    if not isinstance(turns, list) or not turns:
        raise EvalSetError(f"{where}: {case}has no turns. {_OLD_FORMAT}")
    for index, turn in enumerate(turns):
        problem = _turn_problem(turn)
        if problem:
            raise EvalSetError(f"{where}: {case}turn {index} {problem}. {_OLD_FORMAT}")


def _turn_problem(turn: Any) -> str | None:
    if not isinstance(turn, dict):
        return f"is a JSON {type(turn).__name__}, not an object"
    if not isinstance(turn.get("query"), str):
        return "has no `query` string"
    if not isinstance(turn.get("reference", ""), str):
        return "has a `reference` that is not a string"
    tool_uses = turn.get("expected_tool_use", [])
    if not isinstance(tool_uses, list):
        return "has an `expected_tool_use` that is not a list"
    for i, use in enumerate(tool_uses):
        if not (isinstance(use, dict) and isinstance(use.get("tool_name"), str)
                and isinstance(use.get("tool_input"), dict)):
            return (f"has expected_tool_use[{i}] without a `tool_name` string and a "
                    "`tool_input` object")
    responses = turn.get("expected_intermediate_agent_responses", [])
    if not isinstance(responses, list) or not all(
            isinstance(r, dict) and isinstance(r.get("author"), str)
            and isinstance(r.get("text"), str) for r in responses):
        return ("has `expected_intermediate_agent_responses` that are not a list of "
                "{\"author\", \"text\"} strings")
    return None


def _sibling_session(path: Path) -> dict[str, Any]:
    """The :data:`INITIAL_SESSION_FILE` beside a test file; ``{}`` (no session) without one."""
    file = path.parent / INITIAL_SESSION_FILE
    return _read_session(file, f"{file} (the initial session of {path})") if file.is_file() else {}


def _read_session(file: Path, what: str) -> dict[str, Any]:
    """Read as ``AgentEvaluator`` reads ``initial_session_file``, checked as ADK's converter
    uses it."""
    try:
        raw = strict_json(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError included
        raise EvalSetError(f"{what} is not valid JSON: {exc}; fix it or remove it.") from exc
    if not isinstance(raw, dict):
        raise EvalSetError(f"{what} must be an object {{\"app_name\", \"user_id\", \"state\"}}, "
                           f"not a JSON {type(raw).__name__}.")
    _check_session(raw, what)
    return raw


def _check_session(session: dict[str, Any], where: str) -> None:
    for key in ("app_name", "user_id"):
        if not isinstance(session.get(key, ""), str):
            raise EvalSetError(f"{where}: `{key}` must be a string.")
    if not isinstance(session.get("state", {}), dict):
        raise EvalSetError(f"{where}: `state` must be an object of session state keys.")


def _with_stable_ids(eval_set: EvalSet, set_id: str, eval_ids: list[str]) -> EvalSet:
    cases = [
        case.model_copy(update={
            "eval_id": eval_id,
            "creation_timestamp": 0.0,
            "conversation": [
                turn.model_copy(update={"invocation_id": f"{eval_id}-{i}",
                                        "creation_timestamp": 0.0})
                for i, turn in enumerate(case.conversation or [])
            ],
        })
        for case, eval_id in zip(eval_set.eval_cases, eval_ids, strict=True)
    ]
    return eval_set.model_copy(update={"eval_set_id": set_id, "name": set_id,
                                       "creation_timestamp": 0.0, "eval_cases": cases})
