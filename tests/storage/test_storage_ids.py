"""Id validation, the error hierarchy and the package's public surface."""

from __future__ import annotations

import pickle

import pytest

import storage
from evalsnap.errors import EvalsnapError
from storage import (
    CorruptObjectError,
    InvalidId,
    ObjectNotFound,
    StorageError,
    Store,
    StoreUnavailable,
    oid_of,
    validate_id,
)

KIND = "unit"
BAD_IDS = ["..", "a/b", "", "x" * 300, "a\\b", ".hidden", "a b", "../etc", "a..b"]


@pytest.mark.parametrize("bad", BAD_IDS, ids=lambda v: repr(v)[:20])
def test_invalid_ids_rejected(store: Store, bad: str) -> None:
    with pytest.raises(InvalidId):
        validate_id(bad)
    with pytest.raises(InvalidId):
        store.put_ref("runs", bad, b"x")
    with pytest.raises(InvalidId):
        store.get_ref("runs", bad)
    if bad != "a/b":  # "a/b" is a valid two-segment namespace
        with pytest.raises(InvalidId):
            store.put_ref(bad, "name", b"x")
        with pytest.raises(InvalidId):
            store.list_refs(bad)
    assert store.list_refs("runs") == []


def test_valid_ids_accepted() -> None:
    for good in ["a", "A.b_c:d-e", "x" * 200, "2024-05-01T10:00:00", "run.1"]:
        assert validate_id(good) == good


def test_bad_kind_and_oid_rejected(store: Store) -> None:
    oid = oid_of(b"x")
    with pytest.raises(InvalidId):
        store.put_object("bogus", b"x")
    with pytest.raises(InvalidId):
        store.get_object("../unit", oid)
    for bad_oid in ["sha256:" + "A" * 64, "md5:" + "a" * 32, "sha256:../../x", oid[:-1], ""]:
        with pytest.raises(InvalidId):
            store.get_object(KIND, bad_oid)
        with pytest.raises(InvalidId):
            store.has_object(KIND, bad_oid)


def test_errors_contract() -> None:
    errors = [
        CorruptObjectError("s3://b/o", "sha256:" + "0" * 64, "sha256:" + "1" * 64),
        ObjectNotFound("s3://b/o"),
        StoreUnavailable("s3://b", "bucket missing"),
        InvalidId("..", "ref name", "it contains '..'"),
    ]
    for error in errors:
        assert isinstance(error, StorageError) and error.exit_code == 2
        assert isinstance(error, EvalsnapError)  # one root: `except EvalsnapError` catches it
        clone = pickle.loads(pickle.dumps(error))
        assert type(clone) is type(error) and str(clone) == str(error)
        assert vars(clone) == vars(error)


def test_public_surface_is_sorted_and_complete() -> None:
    assert storage.__all__ == sorted(storage.__all__)
    assert all(hasattr(storage, name) for name in storage.__all__)
