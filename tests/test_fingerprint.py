"""Golden hashes pin the canonical form; changing it must bump CANON_VERSION."""

from __future__ import annotations

import hashlib
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evalsnap.fingerprint import CANON_VERSION, VOLATILE_KEYS, canonical_bytes, fingerprint

GOLDEN = "sha256:39ca91b23b591bc12f12ac659c1be325d67f080cbcb1654faede56176be3503c"


def test_canonical_bytes_format_is_pinned():
    assert canonical_bytes("case", {"b": 1, "a": [1, 2, {"x": "é"}]}) == (
        b'evalsnap.case/1\n{"a":[1,2,{"x":"\xc3\xa9"}],"b":1}')
    assert fingerprint("case", {"b": 1, "a": [1, 2, {"x": "é"}]}) == GOLDEN
    assert GOLDEN == "sha256:" + hashlib.sha256(
        canonical_bytes("case", {"a": [1, 2, {"x": "é"}], "b": 1})).hexdigest()


def test_version_and_exclusions_are_pinned():
    # Changing either changes every fingerprint: bump CANON_VERSION and the goldens together.
    assert CANON_VERSION == 1
    assert VOLATILE_KEYS == frozenset({
        "creation_timestamp", "invocation_id", "duration", "model_duration", "tool_duration",
        "duration_details", "session_id", "created_at", "recorded_at", "elapsed_seconds"})


def test_type_header_separates_kinds():
    assert fingerprint("case", {"a": 1}) != fingerprint("rule", {"a": 1})


def test_sequence_order_is_meaning():
    assert fingerprint("case", [1, 2]) != fingerprint("case", [2, 1])


def test_volatile_fields_are_excluded_but_tool_arg_ids_are_not():
    a = {"creation_timestamp": 1.0, "invocation_id": "e-1",
         "call": {"name": "f", "args": {"id": 3}, "id": "adk-123"}}
    b = {"creation_timestamp": 2.0, "invocation_id": "e-2",
         "call": {"name": "f", "args": {"id": 3}, "id": "adk-456"}}
    assert fingerprint("inference", a) == fingerprint("inference", b)
    c = {"call": {"name": "f", "args": {"id": 4}}}
    assert fingerprint("inference", a) != fingerprint("inference", c)


def test_nan_is_rejected():
    with pytest.raises(ValueError):
        fingerprint("case", {"x": math.nan})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_stable_under_key_order(d):
    reordered = dict(reversed(list(d.items())))
    assert fingerprint("case", d) == fingerprint("case", reordered)


_KEYS = st.sampled_from(["name", "args", "response", "id", "text", "created_at", "session_id",
                         "duration", "parts", 1, 2.5, True, None])
_LEAVES = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | \
    st.floats(allow_nan=False, allow_infinity=False)
_VALUES = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=4)
                       | st.lists(inner, max_size=3).map(tuple)
                       | st.dictionaries(_KEYS, inner, max_size=5), max_leaves=25)


@given(_VALUES)
def test_canonical_data_is_the_two_passes_in_one(value):
    """``canonical_data`` makes in one pass what ``strip_volatile(to_jsonable(...))`` made
    in two: keys made strings first (the function-part rule reads them), volatile keys and a
    function part's ``id`` left out, at every depth."""
    from evalsnap.fingerprint import canonical_data, strip_volatile, to_jsonable

    assert canonical_data(value) == strip_volatile(to_jsonable(value))


def test_canonical_data_of_models():
    from google.genai import types

    from evalsnap.fingerprint import canonical_data, strip_volatile, to_jsonable

    content = types.Content(role="model", parts=[
        types.Part(function_call=types.FunctionCall(id="adk-1", name="get", args={"id": 7})),
        types.Part(text="done")])
    value = {"content": content, 3: [content], "created_at": "now"}
    assert canonical_data(value) == strip_volatile(to_jsonable(value))
    assert "adk-1" not in str(canonical_data(value)) and "'id': 7" in str(canonical_data(value))
