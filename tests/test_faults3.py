"""Issue 29, items 7, 8, 9, 13 and 14, through the real CLI: local stores that hold a symbolic
link, ``memory://`` with the scoring pool, and bad input that must be exit 2.

(Item 1, gc racing a run, is ``tests/test_faults3_gc.py``.) The CLI runs in the test process
(:mod:`tests._cli`), but for the scoring pool's run, which starts processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import unicodedata
from pathlib import Path

import pytest

from tests._cli import run_inproc
from tests.conftest import run_cli

MARKER = b"evalsnap store\nlayout: v1\n"
TWO_HOURS_AGO = time.time() - 7200
CASES = ["weather_paris", "cart_add_two_items"]
ONE_METRIC = ["--metric", "response_match_score"]  # no judge where the metrics do not matter


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _hand_made_store(v1: Path, objects: int = 20) -> None:
    """A store's ``v1/`` made by hand: the marker and unreferenced objects, all two hours old
    (what gc removes with its default grace period)."""
    (v1).mkdir(parents=True)
    (v1 / "STORE").write_bytes(MARKER)
    for i in range(objects):
        data = json.dumps({"garbage": i}).encode()
        hexdigest = hashlib.sha256(data).hexdigest()
        path = v1 / "objects" / "judge" / hexdigest[:2] / hexdigest[2:]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for path in [*v1.rglob("*"), v1]:
        os.utime(path, (TWO_HOURS_AGO, TWO_HOURS_AGO))


# ---- item 7: no symbolic link out of a local store ----------------------------------------

def test_gc_does_not_follow_a_symlinked_v1_out_of_the_store(tmp_path: Path) -> None:
    outside = tmp_path / "someone_elses" / "v1"
    _hand_made_store(outside)
    store = tmp_path / "store"
    store.mkdir()
    (store / "v1").symlink_to(outside, target_is_directory=True)
    before = _tree(outside.parent)
    for args in (["--keep-last", "1"], ["--keep-last", "1", "--grace", "0"],
                 ["--keep-last", "1", "--dry-run"]):
        result = run_inproc("gc", "--store", str(store), *args)
        assert result.code == 2, (args, result.stdout[-2000:], result.stderr[-2000:])
        assert "symbolic link" in result.stderr and f"{store}/v1" in result.stderr, result.stderr
        assert "internal error" not in result.stderr
    assert _tree(outside.parent) == before, "gc deleted files outside the store"


def test_gc_refuses_a_symlink_deep_in_the_store_and_deletes_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _hand_made_store(store / "v1")
    outside = tmp_path / "elsewhere"
    _hand_made_store(outside / "v1")
    link = store / "v1" / "objects" / "unit"
    link.symlink_to(outside / "v1" / "objects" / "judge", target_is_directory=True)
    before, before_outside = _tree(store), _tree(outside)
    result = run_inproc("gc", "--store", str(store), "--keep-last", "1", "--json")
    assert result.code == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert str(link) in result.stderr and "symbolic link" in result.stderr, result.stderr
    assert _tree(store) == before and _tree(outside) == before_outside


def test_a_run_does_not_write_through_a_symlinked_v1(shop_copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    store = tmp_path / "store"
    store.mkdir()
    (store / "v1").symlink_to(outside, target_is_directory=True)
    result = run_inproc("run", str(shop_copy), str(shop_copy / "shop.evalset.json"), "--store",
                     str(store), "--case", CASES[0], "--json")
    assert result.code == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"{store}/v1" in result.stderr and "symbolic link" in result.stderr, result.stderr
    assert not list(outside.rglob("*")), "the run wrote outside the store"


def test_a_run_does_not_write_reports_through_a_symlinked_subdirectory(
        shop_copy: Path, tmp_path: Path) -> None:
    """The store is in use (one run published); then its reports folder becomes a link out."""
    store = tmp_path / "store"
    first = run_inproc("run", str(shop_copy), str(shop_copy / "shop.evalset.json"), "--store",
                       str(store), "--case", CASES[0], *ONE_METRIC, "--json")
    assert first.code in (0, 1), first.stderr[-3000:]
    reports = store / "v1" / "refs" / "reports"
    outside = tmp_path / "elsewhere"
    reports.rename(outside)
    reports.symlink_to(outside, target_is_directory=True)
    before = _tree(outside)
    second = run_inproc("run", str(shop_copy), str(shop_copy / "shop.evalset.json"), "--store",
                        str(store), "--case", CASES[1], *ONE_METRIC, "--json")
    # the HTML report is best-effort at publish (evalsnap/pipeline/publish.py): the refused
    # write is a warning naming the link, and the record is published without it
    assert second.code in (0, 1), second.stdout[-2000:] + second.stderr[-3000:]
    assert str(reports) in second.stderr and "symbolic link" in second.stderr, second.stderr
    assert _tree(outside) == before, "a report was written outside the store"


# ---- item 8: memory:// and the scoring process pool ---------------------------------------

def test_a_memory_store_scores_in_one_process(shop_copy: Path) -> None:
    """Enough units for the scoring pool (its threshold lowered to 1): a memory:// store
    lives in this process only, so the run scores here, and completes."""
    result = run_cli("run", str(shop_copy), str(shop_copy / "shop.evalset.json"), "--store",
                     "memory://faults3", *[a for c in CASES for a in ("--case", c)], "--json",
                     env={"EVALSNAP_SCORE_PROCESSES": "1", "EVALSNAP_SCORE_POOL_MIN_UNITS": "1"})
    assert result.code in (0, 1), result.stdout[-2000:] + result.stderr[-3000:]
    body = result.json
    assert body["complete"] is True and body["scored_units"] > 0, body
    assert "is not in store" not in result.stderr


# ---- items 9, 13, 14: bad input is exit 2 -------------------------------------------------

@pytest.mark.parametrize("repetitions", ["0", "-1"])
def test_repetitions_below_one_is_exit_2(shop_copy: Path, store_dir: Path,
                                          repetitions: str) -> None:
    result = run_inproc("run", str(shop_copy), str(shop_copy / "shop.evalset.json"), "--store",
                     str(store_dir), "--case", CASES[0], "--repetitions", repetitions)
    assert result.code == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "--repetitions" in result.stderr and "at least 1" in result.stderr, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


def test_eval_ids_that_differ_only_in_normalization_are_exit_2(shop_copy: Path,
                                                               store_dir: Path) -> None:
    path = shop_copy / "shop.evalset.json"
    evalset = json.loads(path.read_text())
    case = next(c for c in evalset["eval_cases"] if c["eval_id"] == CASES[0])
    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    assert nfc != nfd
    evalset["eval_cases"] += [{**case, "eval_id": nfc}, {**case, "eval_id": nfd}]
    path.write_text(json.dumps(evalset, ensure_ascii=True))
    result = run_inproc("run", str(shop_copy), str(path), "--store", str(store_dir))
    assert result.code == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "normalization" in result.stderr and "internal error" not in result.stderr
    assert not store_dir.exists() or not list(store_dir.rglob("refs/runs/*"))


@pytest.mark.parametrize("days", ["nan", "inf", "-1", "NaN", "-inf"])
def test_gc_older_than_must_be_a_finite_number_of_days(tmp_path: Path, days: str) -> None:
    store = tmp_path / "store"
    _hand_made_store(store / "v1")
    before = _tree(store)
    result = run_inproc("gc", "--store", str(store), "--older-than", days)
    assert result.code == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "--older-than" in result.stderr and "internal error" not in result.stderr
    assert _tree(store) == before
