"""Issue 9: property-based fuzzing of the pure layers (in-process, no CLI, no Prefect).

* canonicalization is stable under dict key order and survives a store round trip;
* every stored record type round-trips through ``to_bytes`` / ``from_bytes``;
* arbitrary JSON, or JSON shaped almost like the real thing, given as an eval set or a
  config raises only evalsnap's typed errors (``EvalsnapError``: exit 2), never anything else.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from google.adk.evaluation.eval_case import Invocation
from google.genai import types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evalsnap.adk.config import load_config, resolve_config
from evalsnap.adk.evalset import load_eval_cases, load_eval_set, parse_eval_set
from evalsnap.errors import EvalsnapError
from evalsnap.fingerprint import canonical_bytes, fingerprint
from evalsnap.records import (
    EvaluationRecord,
    EvaluatorIdentity,
    FrozenCase,
    InferenceRecord,
    InferenceRef,
    LedgerEntry,
    MetricRule,
    RunManifest,
    RunSummary,
    ScoreUnit,
    Snapshot,
    UnitRef,
    UnitRow,
)
from storage import Store

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- JSON values -----------------------------------------------------------------------------

text = st.text(max_size=12)
finite = st.floats(allow_nan=False, allow_infinity=False)
scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | finite | text
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(text, children, max_size=4),
    max_leaves=20,
)
json_objects = st.dictionaries(text, json_values, max_size=5)


def _reordered(value: Any, rnd: Any) -> Any:
    """The same JSON value with every dict's keys in a shuffled insertion order."""
    if isinstance(value, dict):
        keys = list(value)
        rnd.shuffle(keys)
        return {k: _reordered(value[k], rnd) for k in keys}
    if isinstance(value, list):
        return [_reordered(v, rnd) for v in value]
    return value


@FUZZ
@given(value=json_values, rnd=st.randoms(use_true_random=False))
def test_canonical_bytes_ignore_dict_key_order(value: Any, rnd: Any) -> None:
    shuffled = _reordered(value, rnd)
    assert canonical_bytes("fuzz", shuffled) == canonical_bytes("fuzz", value)
    assert fingerprint("fuzz", shuffled) == fingerprint("fuzz", value)


@pytest.fixture(scope="module")
def memory_store() -> Store:
    return Store(f"memory://fuzz-{uuid.uuid4().hex[:8]}")


@FUZZ
@given(value=json_values)
def test_canonical_bytes_round_trip_through_the_store(value: Any, memory_store: Store) -> None:
    data = canonical_bytes("fuzz", value)
    oid = memory_store.put_object("snapshot", data)
    assert oid == fingerprint("fuzz", value)  # the object id is the fingerprint
    assert memory_store.put_object("snapshot", data) == oid  # write-once, idempotent
    back = memory_store.get_object("snapshot", oid)
    assert back == data
    header, _, body = back.decode().partition("\n")
    assert header == "evalsnap.fuzz/1"
    assert canonical_bytes("fuzz", json.loads(body)) == data


# ---- records ---------------------------------------------------------------------------------

fps = st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex())
ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,15}", fullmatch=True)
small = st.integers(0, 1000)
opt_text = st.none() | text
statuses = st.sampled_from(["PASSED", "FAILED", "NOT_EVALUATED", "INFORMATIONAL"])
opt_state = st.none() | json_objects


def _content(role: str) -> Any:
    return st.builds(lambda t: types.Content(role=role, parts=[types.Part(text=t)]), text)


invocations = st.builds(
    lambda uid, user, final: Invocation(invocation_id=uid, user_content=user,
                                        final_response=final),
    text, _content("user"), st.none() | _content("model"))

inference_records = st.builds(
    InferenceRecord, inference_fingerprint=fps, eval_set_id=ids, eval_id=ids,
    repetition=small, app_name=ids, agent_name=ids, adk_version=text,
    status=st.sampled_from(["success", "failure"]), error=opt_text, attempts=small,
    invocations=st.lists(invocations, max_size=3), initial_session_state=opt_state,
    final_session_state=opt_state, model_calls=small, run_id=text, created_at=text)

rows = st.builds(UnitRow, invocation_index=small, score=st.none() | finite, status=statuses,
                 rubric_scores=st.none() | st.lists(json_objects, max_size=2))

score_units = st.builds(
    ScoreUnit, unit_fingerprint=fps, case_fingerprint=fps, rule_fingerprint=fps, eval_id=ids,
    repetition=small, metric_name=ids, threshold=finite, score=st.none() | finite,
    metric_status=statuses, gate_score=st.none() | finite, status=statuses,
    rows=st.lists(rows, max_size=3), complete=st.booleans(), reason=opt_text,
    trace=st.sampled_from(["not_needed", "complete", "unavailable"]), trace_note=opt_text,
    ledger=st.lists(fps, max_size=3), judge_calls=small,
    rubric_scores=st.none() | st.lists(json_objects, max_size=2), run_id=text, created_at=text)

unit_refs = st.builds(
    UnitRef, eval_id=ids, repetition=small, metric_name=ids, unit_oid=fps, unit_fingerprint=fps,
    case_fingerprint=fps, rule_fingerprint=fps, reused=st.booleans(),
    reused_from_run=opt_text, reused_from_record=st.none() | fps, why=text)

inference_refs = st.builds(
    InferenceRef, eval_id=ids, repetition=small, inference_oid=fps, inference_fingerprint=fps,
    status=st.sampled_from(["success", "failure"]), reused=st.booleans(), model_calls=small)

evaluation_records = st.builds(
    EvaluationRecord, run_id=ids, kind=st.sampled_from(["run", "rescore", "import"]),
    eval_set_id=text, app_name=text, snapshot_oid=st.none() | fps,
    parent_record=st.none() | fps, source=opt_text, reuse=st.booleans(), force=st.booleans(),
    inference=st.lists(inference_refs, max_size=3), units=st.lists(unit_refs, max_size=3),
    skipped_cases=st.lists(ids, max_size=2), uninferred_cases=st.lists(ids, max_size=2),
    summary=st.builds(RunSummary, complete=st.booleans(), passed=st.booleans(),
                      agent_calls=small, judge_calls=small, reused_units=small,
                      scored_units=small, reused_judge_samples=small),
    adk_history_path=opt_text, imported_from=opt_text, created_at=text)

identities = st.builds(EvaluatorIdentity,
                       kind=st.sampled_from(["builtin", "custom_function", "custom_class"]),
                       name=text, adk_version=opt_text, template_hash=opt_text,
                       version=opt_text)
snapshots = st.builds(
    Snapshot, eval_set_id=text, eval_set_name=opt_text, app_name=text, adk_version=text,
    cases=st.lists(st.builds(FrozenCase, eval_id=ids, repetition=small, inference_oid=fps,
                             inference_fingerprint=fps, inference_ok=st.booleans(),
                             reference=json_objects, case_fingerprint=fps), max_size=3),
    rules=st.lists(st.builds(MetricRule, metric_name=ids, threshold=finite,
                             criterion=json_objects, evaluator=identities,
                             metric_info=json_objects, judge=st.booleans(),
                             rule_fingerprint=fps), max_size=3),
    created_at=text)

ledger_entries = st.builds(
    LedgerEntry, metric_name=ids, eval_id=ids, repetition=small,
    invocation_index=st.none() | small, sample_index=small, attempt=small, request_key=fps,
    judge_model=json_objects, generation_config=st.none() | json_objects,
    request=json_objects, raw_response=opt_text, error=opt_text,
    parsed=st.none() | json_objects, parse_ok=st.booleans(), evaluator=text,
    aggregation_version=text, source=st.sampled_from(["model", "ledger"]),
    reused_from=st.none() | fps, run_id=text, created_at=text, extra=json_objects)

manifests = st.builds(
    RunManifest, run_id=ids, eval_set_id=text, app_name=text,
    kind=st.sampled_from(["run", "rescore", "import"]), record_oid=fps,
    snapshot_oid=st.none() | fps,
    objects=st.lists(st.builds(lambda k, o: {"kind": k, "oid": o},
                               st.sampled_from(["inference", "unit", "record"]), fps),
                     max_size=3),
    passed=st.booleans(), complete=st.booleans(), created_at=text, checksum=text)

ANY_RECORD = st.one_of(inference_records, score_units, evaluation_records, snapshots,
                       ledger_entries, manifests)


def _stored(record: Any) -> Any:
    """What a record is once stored: its VOLATILE fields (run id, time) left out."""
    return record.model_copy(update={f: type(record).model_fields[f].default
                                     for f in record.VOLATILE})


@FUZZ
@given(record=ANY_RECORD)
def test_any_record_round_trips_through_bytes(record: Any) -> None:
    data = record.to_bytes()
    back = type(record).from_bytes(data, where="fuzz")
    assert back == _stored(record)
    assert back.to_bytes() == data  # the stored form is a fixed point


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=ANY_RECORD)
def test_any_record_round_trips_through_the_store(record: Any, memory_store: Store) -> None:
    kind = "record" if record.KIND == "manifest" else record.KIND
    oid = memory_store.put_object(kind, record.to_bytes())
    assert type(record).from_bytes(memory_store.get_object(kind, oid)) == _stored(record)


# ---- arbitrary input never crashes -----------------------------------------------------------

_EVALSET_KEYS = ["eval_set_id", "name", "eval_cases", "eval_id", "conversation",
                 "conversation_scenario", "user_content", "final_response", "parts", "text",
                 "role", "intermediate_data", "tool_uses", "session_input", "app_name",
                 "user_id", "state", "final_session_state", "invocation_id", "rubrics"]
_CONFIG_KEYS = ["criteria", "customMetrics", "codeConfig", "name", "threshold",
                "judgeModelOptions", "judgeModel", "numSamples", "metricInfo", "version",
                "evalsnapPlugins", "metricVersions", "rubrics", "matchType", "userSimulatorConfig",
                "response_match_score", "tool_trajectory_avg_score", "final_response_match_v2",
                "final_state_match", "hallucinations_v1", "my_metric"]
# Import paths the config fuzzer may name: harmless modules, or none at all.
_SAFE_PATHS = ["json.dumps", "json", "no_such_module_evalsnap.fn", "", "..", "a..b", "os.sep",
               "shop_agent.metrics.response_mentions_city", "math.nan"]


def _shaped(keys: list[str], leaves: Any) -> Any:
    """JSON built mostly from the real format's keys, so it gets past the first checks."""
    return st.recursive(
        leaves,
        lambda children: st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(keys) | text, children, max_size=5),
        max_leaves=25,
    )


# What Python's json also reads but cannot be stored: NaN/Infinity, lone surrogate escapes.
wild = st.floats() | st.sampled_from(["\ud800", "Paris \udfff"])
evalset_like = _shaped(_EVALSET_KEYS, scalars | wild | st.just([]) | st.just({}))
config_leaves = scalars | wild | st.sampled_from(_SAFE_PATHS) | st.sampled_from([0.5, 1, "1", -1])
config_like = _shaped(_CONFIG_KEYS, config_leaves) | st.fixed_dictionaries(
    {"criteria": st.dictionaries(st.sampled_from(_CONFIG_KEYS[-6:]),
                                 config_leaves | _shaped(_CONFIG_KEYS, config_leaves),
                                 min_size=1, max_size=3)},
    optional={"customMetrics": st.dictionaries(st.sampled_from(["my_metric"]), _shaped(
        _CONFIG_KEYS, config_leaves), max_size=1)})


def _typed_error_or_fingerprinted(value: Any) -> None:
    """``value`` as an eval set: a typed error, or cases that can be fingerprinted and stored
    (no NaN, no lone surrogates)."""
    try:
        eval_set = parse_eval_set(json.dumps(value), where="fuzz.evalset.json")
    except EvalsnapError:
        return
    for case in eval_set.eval_cases:
        canonical_bytes("case", case)


@FUZZ
@given(value=json_values | evalset_like)
def test_any_json_as_an_eval_set_raises_only_typed_errors(value: Any) -> None:
    _typed_error_or_fingerprinted(value)


def _loaded(load: Any, path: Path) -> Any:
    try:
        return load(path)
    except EvalsnapError as exc:
        return type(exc), str(exc)


@FUZZ
@given(value=evalset_like | st.fixed_dictionaries(
    {"eval_set_id": st.sampled_from(["s", 7])},
    optional={"eval_cases": st.lists(evalset_like | st.fixed_dictionaries(
        {"eval_id": st.sampled_from(["a", "b", "caf\u00e9", "cafe\u0301"]),
         "conversation": st.just([{"user_content": {"parts": [{"text": "hi"}]}}]) | evalset_like}),
        max_size=4), "creation_timestamp": st.sampled_from([0.0, "x"])}))
def test_the_eval_set_as_rows_refuses_what_the_eval_set_refuses(value: Any) -> None:
    """A run reads its eval set a case at a time (``load_eval_cases``): whatever the file,
    the same error as the whole-file parse (``load_eval_set``), or the same cases."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.evalset.json"
        path.write_text(json.dumps(value), encoding="utf-8")
        whole, rows = _loaded(load_eval_set, path), _loaded(load_eval_cases, path)
    if isinstance(whole, tuple):
        assert rows == whole
    else:
        assert not isinstance(rows, tuple), rows
        assert rows.header == whole.model_copy(update={"eval_cases": []})
        assert list(rows.cases) == whole.eval_cases
        assert rows.ids == [c.eval_id for c in whole.eval_cases]


@FUZZ
@given(text_input=st.text(max_size=60))
def test_any_text_as_an_eval_set_raises_only_typed_errors(text_input: str) -> None:
    try:
        parse_eval_set(text_input, where="fuzz.evalset.json")
    except EvalsnapError:
        pass


@FUZZ
@given(value=json_objects | config_like.filter(lambda v: isinstance(v, dict)))
def test_any_json_object_as_a_config_raises_only_typed_errors(value: dict[str, Any]) -> None:
    try:
        resolve_config(value, where="fuzz_config.json")
    except EvalsnapError:
        pass


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "test_config.json"


@FUZZ
@given(value=json_values | config_like)
def test_any_json_file_as_a_config_raises_only_typed_errors(value: Any,
                                                            config_file: Path) -> None:
    config_file.write_text(json.dumps(value))  # NaN, Infinity, \ud800 escapes included
    try:
        load_config(config_file)
    except EvalsnapError:
        pass


# ---- valid skeletons with arbitrary payloads: reach past the shape checks ---------------------

payload = st.recursive(scalars | wild, lambda c: st.lists(c, max_size=3)
                       | st.dictionaries(text | wild, c, max_size=3), max_leaves=10)
evalset_skeletons = st.builds(
    lambda eval_id, user_text, state, expected_state: {
        "eval_set_id": "fuzz", "eval_cases": [{
            "eval_id": eval_id,
            "conversation": [{"invocation_id": "i1", "user_content": {
                "role": "user", "parts": [{"text": user_text}]}}],
            "session_input": {"app_name": "shop_agent", "user_id": "u", "state": state},
            "final_session_state": expected_state}]},
    text | wild, text | wild, st.dictionaries(text | wild, payload, max_size=3),
    st.none() | st.dictionaries(text | wild, payload, max_size=3))


@FUZZ
@given(value=evalset_skeletons)
def test_an_accepted_eval_set_can_always_be_fingerprinted(value: dict[str, Any]) -> None:
    _typed_error_or_fingerprinted(value)


@FUZZ
@given(metric=st.sampled_from(["response_match_score", "tool_trajectory_avg_score",
                               "final_state_match"]),
       threshold=st.sampled_from([float("nan"), float("inf"), -float("inf"), 10**400])
       | st.floats() | st.integers() | st.booleans() | text | wild,
       as_object=st.booleans())
def test_any_threshold_in_a_config_file_raises_only_typed_errors(
        metric: str, threshold: Any, as_object: bool, config_file: Path) -> None:
    criterion = {"threshold": threshold} if as_object else threshold
    config_file.write_text(json.dumps({"criteria": {metric: criterion}}))
    try:
        load_config(config_file)
    except EvalsnapError:
        pass


# ---- the scan of a stored object's text, whole or a chunk of bytes at a time -------------------


def _scanned(source: Any) -> Any:
    """scan_object's result with "rows" read as items (value, text), or the error's type."""
    from evalsnap.jsonsafe import scan_object

    try:
        return scan_object(source, {"rows": lambda items: list(items)})
    except (ValueError, IndexError, RecursionError) as exc:
        return type(exc) if not isinstance(exc, ValueError) else ValueError


def _in_chunks(data: bytes, sizes: list[int]) -> list[bytes]:
    out, i, k = [], 0, 0
    while i < len(data):
        size = sizes[k % len(sizes)]
        out.append(data[i:i + size])
        i, k = i + size, k + 1
    return out


@FUZZ
@given(head=json_objects, rows=st.lists(json_values, max_size=6),
       spaces=st.sampled_from(["", " ", "\n  "]), sizes=st.lists(st.integers(1, 9), min_size=1,
                                                                   max_size=4))
def test_a_streamed_scan_reads_what_the_whole_text_reads(head: dict[str, Any], rows: list[Any],
                                                        spaces: str, sizes: list[int]) -> None:
    """Issue 31: a long stored object is read a chunk of bytes at a time (its text never
    whole). Cut anywhere, even inside a number, a literal, an escape or a multi-byte
    character, it reads as the whole text does: the same values, the same row texts."""
    doc = {**head, "rows": rows}
    text = json.dumps(doc, ensure_ascii=False, indent=len(spaces) or None)
    whole = _scanned(text)
    if isinstance(whole, dict):  # a text json.loads reads, unless it needs the whole check
        assert {k: v for k, v in whole.items() if k != "rows"} == \
            {k: v for k, v in json.loads(text).items() if k != "rows"}
        assert [json.loads(t) for _, t in whole["rows"]] == json.loads(text)["rows"]
    streamed = _scanned(_in_chunks(text.encode(), sizes))
    if whole is ValueError or streamed is ValueError:
        # a lone surrogate escape: the whole is the caller's to check (needs_whole_check)
        assert "\\u" in text
    else:
        assert streamed == whole


@FUZZ
@given(text=st.text(alphabet='{}[]",:0123456789.eE+-tructfalsenul \\u\n', max_size=40)
       | st.sampled_from(['{"rows": [1, 2,]}', '{"a": 1, "a": 2}', '{"rows": [1] } x',
                          '{"rows": [12', '{"a": tru', '{"rows": [1 2]}', '{"a": 1}{"b": 2}']),
       sizes=st.lists(st.integers(1, 5), min_size=1, max_size=3))
def test_a_streamed_scan_refuses_what_the_whole_text_refuses(text: str, sizes: list[int]) -> None:
    """Any text, cut anywhere: the streamed scan reads it as the whole scan does, or both
    refuse it (the caller then reads it the one strict way, which says what is wrong)."""
    whole, streamed = _scanned(text), _scanned(_in_chunks(text.encode(), sizes))
    if isinstance(whole, dict) or isinstance(streamed, dict):
        assert streamed == whole
    else:
        assert streamed in (ValueError, IndexError, RecursionError)


def test_bytes_that_are_no_utf8_are_refused_a_chunk_at_a_time() -> None:
    from evalsnap.jsonsafe import scan_object

    for data in ['{"rows": ["é"]}'.encode()[:-4], b'{"rows": ["\xff"]}', b'{"rows": ["\xc3']:
        with pytest.raises(ValueError):
            scan_object(_in_chunks(data, [1]), {"rows": list})


def test_a_long_value_is_not_decoded_again_after_every_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value longer than a chunk is decoded again with at least as much text again each
    time, not after every chunk: a crafted object of one long string (up to the 1 GiB an
    object may have) costs its length, not its square. Counted in decode calls."""
    from evalsnap import jsonsafe

    calls = [0]
    decode = jsonsafe.STRICT_DECODER.raw_decode

    def counted(text: str, i: int = 0) -> Any:
        calls[0] += 1
        return decode(text, i)

    monkeypatch.setattr(jsonsafe.STRICT_DECODER, "raw_decode", counted)
    doc = {"a": "x" * 200_000, "b": [1.5] * 20_000, "rows": [{"n": i} for i in range(50)]}
    data = json.dumps(doc).encode()
    head = jsonsafe.scan_object(_in_chunks(data, [100]), {"rows": list})  # ~6,000 chunks
    assert head["a"] == doc["a"] and head["b"] == doc["b"] and len(head["rows"]) == 50
    assert calls[0] < 150, calls[0]  # keys, values and rows, and a few decodes again
    assert jsonsafe.scan_object(" " * 100_000 + json.dumps(doc) + " " * 100_000,
                                {"rows": list})["a"] == doc["a"]


def test_an_escape_checked_on_the_whole_is_found_cut_across_chunks() -> None:
    """A lone surrogate escape (``\\ud800``) makes a stored object's rows read the strict
    way (which refuses it), even cut across chunks of one byte."""
    from evalsnap.jsonsafe import scan_object

    data = b'{"rows": ["a\\ud800b"]}'
    for size in (1, 2, 3, 7, len(data)):
        with pytest.raises(ValueError, match="checked on the whole"):
            scan_object(_in_chunks(data, [size]), {"rows": list})


@FUZZ
@given(items=st.lists(json_values, max_size=6), cut=st.integers(0, 400),
       space=st.sampled_from(["", " ", "\n\t "]))
def test_a_list_read_an_item_at_a_time_is_the_list_or_refused_as_it_is(
        items: list[Any], cut: int, space: str) -> None:
    """scan_array reads any JSON list, cut anywhere or not, as strict_json reads it whole:
    the same items, or a ValueError (never another error, never other items)."""
    from evalsnap.jsonsafe import scan_array, strict_json

    whole = space + json.dumps(items, separators=("," + space, ":")) + space
    for text in (whole, whole[:cut]):
        try:
            expected: Any = strict_json(text)
        except ValueError:
            expected = ValueError
        try:
            got: Any = list(scan_array(text))
        except ValueError:
            got = ValueError
        if expected is not ValueError and not isinstance(expected, list):
            assert got is ValueError  # JSON, but not a list
        else:
            assert got == expected, text
