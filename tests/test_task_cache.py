"""Prefect's task cache is inert: it can neither import nor run anything a store holds,
and it hands out only what the reuse authority would (``tasks.results``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from prefect.serializers import JSONSerializer, PickleSerializer

from evalsnap.pipeline import reuse
from evalsnap.records import repo
from tasks.results import IdsSerializer, StoreResults

MARKER_ENV = "EVALSNAP_TEST_PWNED"


class Evil:
    def __reduce__(self):  # runs on unpickling
        return (os.system, (f"touch {os.environ[MARKER_ENV]}",))


def _record(serializer: dict, result: str) -> bytes:
    return json.dumps({"metadata": {"storage_key": "k", "expiration": None,
                                    "serializer": serializer, "prefect_version": "3.9.1",
                                    "storage_block_id": None},
                       "result": result}).encode()


def _unit(fp: str, complete: bool = True) -> dict:
    return {"eval_id": "c", "repetition": 0, "metric_name": "m", "unit_oid": "sha256:" + "0" * 64,
            "unit_fingerprint": fp, "case_fingerprint": "sha256:c", "rule_fingerprint": "sha256:r",
            "complete": complete, "status": "PASSED", "run_id": "r", "why": "new"}


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StoreResults:
    monkeypatch.setenv(MARKER_ENV, str(tmp_path / "pwned"))
    return StoreResults(store_url=str(tmp_path / "store"))


def _plant(results: StoreResults, key: str, data: bytes) -> None:
    repo.open_store(results.store_url).put_task_result(key, data)


def test_a_planted_pickle_is_refused_without_being_unpickled(results, tmp_path) -> None:
    key = reuse.score_key("m", [("c", 0, "sha256:u")])
    blob = PickleSerializer().dumps(Evil()).decode()
    _plant(results, key, _record({"type": "pickle", "picklelib": "cloudpickle"}, blob))
    with pytest.raises(FileNotFoundError):
        results.read_path(key)
    assert not (tmp_path / "pwned").exists()
    # and Prefect's own lookup through this storage reads it as absent
    from prefect.results import ResultStore

    assert ResultStore(result_storage=results, serializer=IdsSerializer()).exists(key) is False
    assert not (tmp_path / "pwned").exists()


def test_a_planted_json_class_is_refused_without_being_imported(results, tmp_path) -> None:
    key = reuse.inference_key(["sha256:f"])
    payload = json.dumps({"__class__": "os.system", "data": f"touch {tmp_path / 'pwned'}"})
    _plant(results, key, _record(JSONSerializer().model_dump(), payload))
    with pytest.raises(FileNotFoundError):
        results.read_path(key)
    # a record naming our serializer with a __class__ payload is data, and not an outcome
    _plant(results, key, _record({"type": "evalsnap-ids"}, payload))
    with pytest.raises(FileNotFoundError):
        results.read_path(key)
    assert not (tmp_path / "pwned").exists()


def test_a_well_formed_entry_the_indexes_do_not_back_is_absent(results) -> None:
    units = [_unit("sha256:u1"), _unit("sha256:u2")]
    key = reuse.score_key("m", [("c", 0, "sha256:u1"), ("c", 0, "sha256:u2")])
    assert reuse.cacheable(key, units)
    _plant(results, key, _record({"type": "evalsnap-ids"}, json.dumps(units)))
    with pytest.raises(FileNotFoundError):  # no unit index entry names these units
        results.read_path(key)


@pytest.mark.parametrize("value, why", [
    ([_unit("sha256:u1", complete=False)], "an incomplete unit"),
    ([_unit("sha256:other")], "units that are not the key's"),
    ([], "nothing at all"),
    ([{"__class__": "os.system"}], "not an outcome"),
])
def test_only_complete_results_under_their_own_key_are_cacheable(value, why) -> None:
    key = reuse.score_key("m", [("c", 0, "sha256:u1")])
    assert not reuse.cacheable(key, value), why


def test_write_path_keeps_nothing_that_is_not_cacheable(results) -> None:
    key = reuse.score_key("m", [("c", 0, "sha256:u1")])
    content = _record({"type": "evalsnap-ids"}, json.dumps([_unit("sha256:u1", complete=False)]))
    results.write_path(key, content)
    assert repo.open_store(results.store_url).get_task_result(key) is None
    good = _record({"type": "evalsnap-ids"}, json.dumps([_unit("sha256:u1")]))
    results.write_path(key, good)
    assert repo.open_store(results.store_url).get_task_result(key) == good


def test_the_serializer_writes_and_reads_plain_data_only() -> None:
    s = IdsSerializer()
    assert s.loads(s.dumps([{"a": 1, "b": [None, "x"]}])) == [{"a": 1, "b": [None, "x"]}]
    with pytest.raises(ValueError):
        s.dumps(Evil())
    with pytest.raises(ValueError):
        s.loads(b"[NaN]")
    with pytest.raises(ValueError):
        s.loads(b"[" * 40 + b"]" * 40)


def _scored(*fps: str, complete: bool = True) -> Any:
    from evalsnap.pipeline.outcomes import UnitOutcome
    from evalsnap.rows import Rows

    return Rows(UnitOutcome, [UnitOutcome.model_validate(
        {**_unit(fp, complete), "eval_id": f"c{n}"}) for n, fp in enumerate(fps)])


def test_a_scoring_tasks_rows_are_kept_as_one_object_and_cached_as_its_handle(results) -> None:
    """Issue 31 (memory): Prefect copies a task's result ~3 times as it persists it, and a
    metric's result is a row per case; so a scoring task's rows are written as one object
    (read back a line at a time, exactly) and the cached result is the handle naming it."""
    from evalsnap.pipeline import context

    rows = _scored("sha256:u1", "sha256:u2")
    key = reuse.score_key("m", [("c0", 0, "sha256:u1"), ("c1", 0, "sha256:u2")])
    with context.started(results.store_url) as ctx:  # the run's, as in a flow
        _kept_and_written(results, ctx, key, rows)


def _kept_and_written(results: StoreResults, ctx: Any, key: str, rows: Any) -> None:
    from evalsnap.records import outcomes

    reuse.keep_outcomes(ctx, key, rows)
    oid = outcomes.handle_oid(rows.kept)
    assert oid is not None and rows.kept == {"outcomes": oid, "rows": 2}
    store = repo.open_store(results.store_url)
    assert list(outcomes.read_lines(store, oid)) == list(rows.json_items())
    assert json.loads(store.get_object("outcomes", oid)) == [
        json.loads(b) for b in rows.json_items()]  # JSON to every other reader (gc)
    s = IdsSerializer()
    handle = s.dumps(rows)
    assert json.loads(handle) == rows.kept and len(handle) < 100
    content = _record({"type": "evalsnap-ids"}, handle.decode())
    other = reuse.score_key("m", [("c0", 0, "sha256:u1")])
    results.write_path(other, content)  # not the key these rows make: not written
    assert store.get_task_result(other) is None
    results.write_path(key, content)
    assert store.get_task_result(key) == content
    # a handle of rows this process did not keep under that key is not written either
    forged = _record({"type": "evalsnap-ids"}, json.dumps({"outcomes": "sha256:" + "1" * 64,
                                                            "rows": 2}))
    results.write_path(other, forged)
    assert store.get_task_result(other) is None
    crafted = _record({"type": "evalsnap-ids"}, json.dumps({"outcomes": "../x", "rows": 2}))
    results.write_path(other, crafted)  # refused, not raised (an id that is no object id)
    assert store.get_task_result(other) is None


def test_rows_that_may_not_be_cached_are_not_kept(results, caplog) -> None:
    from evalsnap.pipeline import context

    store = repo.open_store(results.store_url)
    with context.started(results.store_url) as ctx:
        _not_kept(results, ctx, store)
    assert list(store.iter_objects("outcomes")) == []
    # every --force run persists such a handle: not cached, and nothing to warn about
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text


def _not_kept(results: StoreResults, ctx: Any, store: Any) -> None:
    for rows, key in [(_scored("sha256:u1", complete=False),
                       reuse.score_key("m", [("c0", 0, "sha256:u1")])),
                      (_scored("sha256:u1"), None)]:  # --force, or an untrusted metric
        reuse.keep_outcomes(ctx, key, rows)
        assert rows.kept == {"outcomes": None, "rows": 1}
        assert IdsSerializer().loads(IdsSerializer().dumps(rows)) == rows.kept
        if key is not None:
            results.write_path(key, _record({"type": "evalsnap-ids"},
                                            IdsSerializer().dumps(rows).decode()))
            assert store.get_task_result(key) is None


def test_a_cached_handle_is_used_only_when_its_object_is_intact(results) -> None:
    """A handle whose object is gone, damaged or names units no index backs reads as
    absent (the task runs), as a damaged list did."""
    from evalsnap.pipeline import context
    from evalsnap.records import outcomes

    rows = _scored("sha256:u1")
    key = reuse.score_key("m", [("c0", 0, "sha256:u1")])
    with context.started(results.store_url) as ctx:
        reuse.keep_outcomes(ctx, key, rows)
    store = repo.open_store(results.store_url)
    oid = outcomes.handle_oid(rows.kept)
    content = _record({"type": "evalsnap-ids"}, IdsSerializer().dumps(rows).decode())
    for handle in (rows.kept, {"outcomes": "sha256:" + "2" * 64, "rows": 1},
                   {"outcomes": "../x", "rows": 1}, {"outcomes": oid, "rows": 0}):
        assert not reuse.cache_hit_usable(store, key, handle)  # no unit index backs it
    _plant(results, key, content)
    with pytest.raises(FileNotFoundError):
        results.read_path(key)
    path = Path(results.store_url) / "v1" / "objects" / "outcomes" / oid[7:9] / oid[9:]
    assert path.is_file(), list(Path(results.store_url).rglob("*"))
    path.write_bytes(path.read_bytes().replace(b'"PASSED"', b'"FAILED"'))
    fresh = repo.open_store(results.store_url)
    with pytest.raises(Exception, match="sha256|corrupt|hash"):
        list(outcomes.read_lines(fresh, oid))


def test_no_key_with_force_or_for_an_untrusted_metric_and_no_read_without_reuse() -> None:
    from types import SimpleNamespace as NS

    def request(**kw):
        return NS(**{**dict(reuse=True, force=False, trusted=True, metric_name="m",
                            units_digest="d"), **kw})

    def score(**kw):
        return reuse.score_cache_key(None, {"request": request(**kw)})

    assert score() is not None and score(reuse=False) == score()
    assert score(force=True) is None
    assert score(trusted=False) is None
    assert reuse.refresh_cache(request()) is False  # --reuse: a hit may be used
    assert reuse.refresh_cache(request(reuse=False)) is True  # written for later, never read
    assert reuse.refresh_cache(request(force=True)) is True
    batch = NS(reuse=False, items=[NS(fingerprint="sha256:f")])
    assert reuse.inference_cache_key(None, {"request": batch}) == reuse.inference_key(
        ["sha256:f"])
    assert reuse.refresh_cache(batch) is True


def test_alike_answers_of_another_repetition_are_another_key() -> None:
    """A unit fingerprint is content: two ``--until-stable`` rounds whose answers are alike
    have the same fingerprints. The key names the case and repetition too, so a round never
    gets an earlier round's outcomes (which name that round's repetitions) from the cache."""
    round_one = {**_unit("sha256:u1"), "repetition": 5}
    key_one = reuse.score_key("m", [("c", 5, "sha256:u1")])
    key_two = reuse.score_key("m", [("c", 10, "sha256:u1")])
    assert key_one != key_two
    assert reuse.cacheable(key_one, [round_one])
    assert not reuse.cacheable(key_two, [round_one])


def test_a_result_is_checked_an_item_at_a_time_as_it_is_read() -> None:
    """A stored result is parsed an item at a time (a metric's holds a row per case): the
    check reads items only while they pass, and a result that is not a plain list of
    outcomes is refused, as the whole parse refused it."""
    from evalsnap.records.task_results import record_items

    units = [_unit(f"sha256:u{i}") for i in range(5)]
    key = reuse.score_key("m", [("c", 0, f"sha256:u{i}") for i in range(5)])
    data = _record({"type": "evalsnap-ids"}, json.dumps(units))
    assert list(record_items(data)) == units
    assert reuse.cacheable(key, record_items(data))  # an iterator, read once
    assert not reuse.cacheable(key, record_items(_record({"type": "evalsnap-ids"},
                                                         json.dumps(units[:4]))))
    read: list[dict] = []
    bad = [units[0], _unit("sha256:u1", complete=False), *units[2:]]

    def counted() -> Any:
        for item in record_items(_record({"type": "evalsnap-ids"}, json.dumps(bad))):
            read.append(item)
            yield item

    assert not reuse.cacheable(key, counted()) and len(read) == 2  # stopped at the bad one
    text = json.dumps(units)
    for result in (text[:-1] + ",]", text.replace("},", "}", 1), text + "[]", "{}",
                   text[:-1] + ', NaN]', text[:-1] + ', "\\ud800"]', "[" * 40 + "]" * 40,
                   text[:-1]):
        with pytest.raises(ValueError):
            list(record_items(_record({"type": "evalsnap-ids"}, result)))
        assert not reuse.cacheable(key, record_items(_record({"type": "evalsnap-ids"}, result)))
    with pytest.raises(ValueError):  # not ours: refused when asked, before any item
        record_items(_record({"type": "pickle"}, text))


def test_gc_follows_a_handle_to_its_outcomes_and_their_units() -> None:
    """gc keeps what a cached result names: a scoring result's outcomes object, and the
    units its rows name (as it kept the units a cached list named)."""
    from evalsnap.records._gc_mark import _links, ref_target

    oid, unit = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    handle = _record({"type": "evalsnap-ids"}, json.dumps({"outcomes": oid, "rows": 1}))
    assert ref_target("prefect result", handle, "v1/prefect/x") == {oid}
    listed = _record({"type": "evalsnap-ids"}, json.dumps([_unit("sha256:u1")]))
    assert ref_target("prefect result", listed, "v1/prefect/x") == {"sha256:" + "0" * 64}
    assert _links("outcomes", [{**_unit("sha256:u1"), "unit_oid": unit}]) == ({unit}, None)
    crafted = _record({"type": "evalsnap-ids"}, json.dumps({"outcomes": "../../x", "rows": 1}))
    assert ref_target("prefect result", crafted, "v1/prefect/x") is None
