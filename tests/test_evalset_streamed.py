"""An eval set object is read a case at a time (issue 31: the whole file parsed at once was
~10 times its size in objects at 30,000 cases): the same cases, header and ids as the one
strict read, and for anything that read refuses, the same error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalsnap.adk import evalset
from evalsnap.adk.evalset import EvalCases, load_eval_cases, load_eval_set
from evalsnap.errors import EvalsnapError

ROOT = Path(__file__).resolve().parents[1]
GOOD = sorted(p for p in [*ROOT.glob("examples/*/*.evalset.json"),
                          *ROOT.glob("tests/fixtures/**/*.evalset.json")]
              if isinstance(json.loads(p.read_text("utf-8")), dict))
BAD = Path(__file__).parent / "bad_inputs"


def _same(a: EvalCases, b: EvalCases) -> None:
    assert a.header == b.header and a.ids == b.ids
    assert list(a.cases.json_items()) == list(b.cases.json_items())


@pytest.mark.parametrize("path", GOOD, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_case_at_a_time_is_the_strict_read(path: Path) -> None:
    streamed = evalset._cases_streamed(path.read_text("utf-8"), str(path))
    assert streamed is not None  # a plain eval set object is read a case at a time
    _same(streamed, EvalCases.of(load_eval_set(path)))
    _same(load_eval_cases(path), streamed)


def _bad_texts() -> list[tuple[str, str]]:
    out = []
    for f in sorted(BAD.glob("*.json")):
        spec = json.loads(f.read_text("utf-8"))
        if "evalset_text" in spec:
            out.append((f.stem, spec["evalset_text"]))
        elif "evalset" in spec:
            out.append((f.stem, json.dumps(spec["evalset"], indent=1)))
    good = json.loads((ROOT / "examples/shop_agent/shop.evalset.json").read_text("utf-8"))
    text = json.dumps(good, indent=1)
    cases = text.index('"eval_cases": [') + len('"eval_cases": [')
    out += [  # what a scanner could let through that JSON does not
        ("trailing comma in the cases", text[:text.rindex("]")] + ",]" + text[text.rindex("]") + 1:]),
        ("trailing comma in the object", text[:text.rindex("}")] + ",}"),
        ("eval_cases given twice", text[:cases] + "], \"eval_cases\": [" + text[cases:]),
        ("text after the object", text + " {}"),
        ("a case that is not an object", text[:cases] + "3, " + text[cases:]),
        ("no eval_cases", json.dumps({"eval_set_id": "x"})),
        ("NaN in a case", text.replace('"eval_cases": [', '"eval_cases": [NaN, ', 1)),
    ]
    return out


@pytest.mark.parametrize(("name", "text"), _bad_texts(), ids=lambda v: v if len(v) < 60 else "")
def test_what_the_strict_read_refuses_is_refused_with_its_error(
        name: str, text: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.evalset.json"
    path.write_text(text, "utf-8")
    try:
        expected = EvalCases.of(load_eval_set(path))
    except EvalsnapError as exc:
        assert evalset._cases_streamed(text, str(path)) is None
        with pytest.raises(type(exc)) as got:
            load_eval_cases(path)
        assert str(got.value) == str(exc)
    else:  # a file the strict read accepts (a list: an old format) reads the same
        _same(load_eval_cases(path), expected)
