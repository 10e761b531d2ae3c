"""Loading ADK eval sets with errors that name the file and what to fix."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from google.adk.evaluation.eval_set import EvalSet
from pydantic import ValidationError

from evalsnap.errors import EvalSetError, InputFileError


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"{err.get('msg')} at `{loc}`" if loc else str(err.get("msg"))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (use a finite number or null)")


def strict_json(text: str) -> Any:
    """``json.loads`` limited to what can be stored and fingerprinted: no NaN/Infinity, no
    lone surrogate escapes (``\\ud800``), no nesting too deep to parse. Any of those raises
    ``ValueError`` (``json.JSONDecodeError`` for syntax errors)."""
    try:
        raw = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    try:
        json.dumps(raw, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("it contains a lone surrogate escape such as \\ud800, which is not "
                         "text") from None
    return raw


def parse_eval_set(text: str, *, where: str) -> EvalSet:
    """Parses and checks an eval set; raises ``EvalSetError`` naming ``where``."""
    try:
        raw = strict_json(text)
    except json.JSONDecodeError as exc:
        raise EvalSetError(
            f"{where} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "fix the file, or regenerate it with `adk web`."
        ) from exc
    except ValueError as exc:
        raise EvalSetError(f"{where} is not valid JSON: {exc}; fix the file.") from exc
    if not isinstance(raw, dict):
        raise EvalSetError(
            f"{where} must hold an ADK EvalSet object with `eval_set_id` and `eval_cases`, "
            f"not a JSON {type(raw).__name__}."
        )
    try:
        eval_set = EvalSet.model_validate(raw)
    except ValidationError as exc:
        raise EvalSetError(
            f"{where} is not a valid ADK eval set: {_first_error(exc)}. "
            "See ADK's EvalSet format (eval_set_id, eval_cases[].conversation)."
        ) from exc
    _check_cases(eval_set, where)
    return eval_set


def _check_cases(eval_set: EvalSet, where: str) -> None:
    dupes = [k for k, n in Counter(c.eval_id for c in eval_set.eval_cases).items() if n > 1]
    if dupes:
        raise EvalSetError(
            f"{where} has duplicate eval_id(s) {', '.join(sorted(dupes))}; "
            "every case needs a unique eval_id (cases are matched by it)."
        )
    for case in eval_set.eval_cases:
        if case.conversation is None and case.conversation_scenario is None:
            raise EvalSetError(
                f"{where}: case {case.eval_id!r} has neither `conversation` nor "
                "`conversation_scenario`; add the expected turns."
            )
        for index, invocation in enumerate(case.conversation or []):
            parts = invocation.user_content.parts or []
            if not any((p.text or "").strip() or p.inline_data or p.file_data for p in parts):
                raise EvalSetError(
                    f"{where}: case {case.eval_id!r} turn {index} has no user content; "
                    "give every invocation a `user_content` with text."
                )


def load_eval_set(path: str | Path) -> EvalSet:
    """Reads an ``.evalset.json`` file."""
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"eval set {p} does not exist; pass the path of an .evalset.json file.")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"cannot read eval set {p}: {exc}") from exc
    return parse_eval_set(text, where=str(p))
