"""Baselines that stick: accepted and pinned runs, the tombstones gc leaves, ``last-good``.

Small JSON refs beside the run manifests (docs/storage.md, "Store layout"):

* ``v1/refs/accepted/<eval set>/<run_id>`` — ``evalsnap accept RUN``: the run is a good
  baseline although it failed its gate (who accepted it, when, a note);
* ``v1/refs/pins/<run_id>`` — ``evalsnap pin RUN``: gc keeps the run (who, when, a label);
* ``v1/refs/tombstones/runs/<run_id>`` and ``v1/refs/tombstones/records/<record hex>`` —
  written by gc before it removes a run's manifest, so that a later reference to the run
  or its record says "removed by gc on …" instead of "not in the store".

Each is read with the one strict parse of stored bytes (:func:`parse_stored`, at most
:data:`MAX_MARK_BYTES`) into a strict model; one that does not parse, or does not match
where it lies, is a :class:`~evalsnap.errors.CorruptRecordError` (a ``verify`` finding;
gc keeps the run it names; ``last-good`` ignores it with a warning), never a crash.

``last-good`` (:func:`last_good`): the newest *full* run of an eval set, by when the store
wrote its manifest (as ``latest``), that was accepted or that passed its own gate. Whether
a run passed its gate is the caller's to say (``good``): it re-reads the record's summary
and regressions, which :mod:`evalsnap.reports` computes (:mod:`evalsnap.reports.lastgood`).
"""

from __future__ import annotations

import datetime as dt
import getpass
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evalsnap import settings
from evalsnap.errors import CorruptRecordError, EvalsnapError, UsageError
from evalsnap.records import RunManifest, repo
from evalsnap.records._base import first_problem, parse_stored
from storage import InvalidId, Store, TooLarge
from storage.gc import list_files
from storage.ids import OID_PATTERN

__all__ = ["ACCEPTED", "Mark", "PINS", "TOMBSTONE_RECORDS", "TOMBSTONE_RUNS", "Acceptance", "GoodFn",
           "LastGood", "Pin", "Tombstone", "accept", "accepted", "bury", "last_good",
           "parse_mark", "pick_last_good", "pin", "pins", "read_mark", "tombstone", "unpin",
           "who"]

logger = logging.getLogger(__name__)

ACCEPTED = "accepted"
PINS = "pins"
TOMBSTONE_RUNS = "tombstones/runs"
TOMBSTONE_RECORDS = "tombstones/records"
#: The most bytes a mark can have (a few ids, a name, a date and a note).
MAX_MARK_BYTES = 64 * 1024
#: The longest note or label a person may give.
MAX_TEXT = 2000
LAST_GOOD = "last-good"

_Oid = Annotated[str, Field(pattern=OID_PATTERN.pattern)]
_Text = Annotated[str, Field(max_length=MAX_TEXT)]
M = TypeVar("M", bound="Mark")
#: Whether a run passed its own gate (``--fail-on``), re-evaluated from what is stored.
GoodFn = Callable[[Store, RunManifest], bool]


class Mark(BaseModel):
    """A mark as read: exactly the types written, other keys ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    run_id: Annotated[str, Field(min_length=1)]
    eval_set_id: str
    record_id: _Oid


class _Signed(Mark):
    """A mark a person set: who, and when."""

    by: _Text
    at: _Text
    """When (UTC, ISO 8601)."""


class Acceptance(_Signed):
    """``evalsnap accept RUN``: the run is a good baseline from now on."""

    note: _Text | None = None


class Pin(_Signed):
    """``evalsnap pin RUN``: gc keeps the run (and everything it names)."""

    label: _Text | None = None


class Tombstone(Mark):
    """What gc leaves of a run it removed."""

    removed_at: _Text
    """When gc removed it (UTC, ISO 8601)."""


def who() -> str:
    """Who is doing this: ``EVALSNAP_USER``, else the operating system's user name."""
    user = settings.get().user
    if user:
        return _checked_text(user, "user name (EVALSNAP_USER)") or user
    try:
        return getpass.getuser() or "unknown"
    except (KeyError, OSError):  # no name for this uid (a container), no LOGNAME
        return "unknown"


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _bytes(mark: Mark) -> bytes:
    return mark.model_dump_json(exclude_none=False).encode()


def parse_mark(cls: type[M], data: bytes, *, where: str, namespace: str, name: str) -> M:
    """The mark ``cls`` in ``data``, read from ref ``namespace/name`` (``where``: its URL);
    ``CorruptRecordError`` if it does not parse or does not match where it lies."""
    advice = ("run `evalsnap verify`; delete the file, then pin or accept the run again "
              "(`evalsnap pin RUN`, `evalsnap accept RUN`) if it is still wanted")
    raw = parse_stored(data, what=where, limit=MAX_MARK_BYTES, advice=advice)
    try:
        mark = cls.model_validate(raw)
    except ValidationError as exc:
        raise CorruptRecordError(f"{where} is not a {cls.__name__.lower()} "
                                 f"({first_problem(exc)}); {advice}.") from exc
    filed = repo.hexof(mark.record_id) if namespace == TOMBSTONE_RECORDS \
        else repo.ref_name(mark.run_id)
    if filed != name:
        raise CorruptRecordError(f"{where} names run {mark.run_id!r} (record "
                                 f"{mark.record_id}), not the one it is filed under; {advice}.")
    if namespace.startswith(f"{ACCEPTED}/") and \
            repo.ref_name(mark.eval_set_id) != namespace.split("/", 1)[1]:
        raise CorruptRecordError(f"{where} accepts a run of eval set {mark.eval_set_id!r}, "
                                 f"filed under another; {advice}.")
    return mark


def read_mark(store: Store, cls: type[M], namespace: str, name: str) -> M | None:
    """The mark ``namespace/name`` (None: there is none); ``CorruptRecordError`` if damaged."""
    where = f"{store.url.rstrip('/')}/v1/refs/{namespace}/{name}"
    try:
        data = store.get_ref(namespace, name)
    except TooLarge as exc:
        raise CorruptRecordError(f"{where} is larger than a mark can be ({exc}); run "
                                 "`evalsnap verify` and delete it.") from exc
    except InvalidId as exc:  # a planted file: evalsnap never writes such a name
        raise CorruptRecordError(f"{where} is not a mark evalsnap writes ({exc}); delete "
                                 "it.") from exc
    if data is None:
        return None
    return parse_mark(cls, data, where=where, namespace=namespace, name=name)


# ---- accept, pin, unpin --------------------------------------------------------------------

def _checked_text(value: str | None, what: str) -> str | None:
    if value is not None and len(value) > MAX_TEXT:
        raise UsageError(f"the {what} has {len(value)} characters; give at most {MAX_TEXT}.")
    return value


def accept(store: Store, manifest: RunManifest, note: str | None = None) -> Acceptance:
    """Records that ``manifest``'s run is accepted (a full run only: ``last-good`` never
    takes a subset); a run accepted again gets the new who, when and note."""
    if manifest.full is False:
        raise UsageError(f"run {manifest.run_id} covers only part of eval set "
                         f"{manifest.eval_set_id} or its config; `--baseline last-good` takes "
                         "full runs only, so accept a full run (to keep this one from gc, "
                         "`evalsnap pin` it).")
    mark = Acceptance(run_id=manifest.run_id, eval_set_id=manifest.eval_set_id,
                      record_id=manifest.record_oid, by=who(), at=now_iso(),
                      note=_checked_text(note, "note"))
    store.put_ref(f"{ACCEPTED}/{repo.ref_name(manifest.eval_set_id)}",
                  repo.ref_name(manifest.run_id), _bytes(mark))
    return mark


def pin(store: Store, manifest: RunManifest, label: str | None = None) -> Pin:
    """Pins ``manifest``'s run: gc keeps it; pinned again, it gets the new who, when, label."""
    mark = Pin(run_id=manifest.run_id, eval_set_id=manifest.eval_set_id,
               record_id=manifest.record_oid, by=who(), at=now_iso(),
               label=_checked_text(label, "label"))
    store.put_ref(PINS, repo.ref_name(manifest.run_id), _bytes(mark))
    return mark


def unpin(store: Store, run_id: str) -> bool:
    """Removes the pin of ``run_id`` (damaged or not); False if it had none."""
    name = repo.ref_name(run_id)
    if store.get_ref(PINS, name) is None:
        return False
    store.delete_ref(PINS, name)
    return True


def _marks(store: Store, cls: type[M], namespace: str, names: Iterable[str]
           ) -> tuple[dict[str, M], dict[str, str]]:
    good: dict[str, M] = {}
    bad: dict[str, str] = {}
    for name in names:
        try:
            mark = read_mark(store, cls, namespace, name)
        except CorruptRecordError as exc:
            bad[name] = str(exc)
            continue
        if mark is not None:
            good[name] = mark
    return good, bad


def pins(store: Store) -> tuple[dict[str, Pin], dict[str, str]]:
    """Every pin by run name, and the damaged ones (run name → what is wrong)."""
    return _marks(store, Pin, PINS, store.list_refs(PINS))


def accepted(store: Store, eval_set_id: str | None = None
             ) -> tuple[dict[str, Acceptance], dict[str, str]]:
    """The acceptances of ``eval_set_id`` (None: of every eval set) by run name, and the
    damaged ones (run name → what is wrong)."""
    if eval_set_id is not None:
        folder = f"{ACCEPTED}/{repo.ref_name(eval_set_id)}"
        return _marks(store, Acceptance, folder, store.list_refs(folder))
    good: dict[str, Acceptance] = {}
    bad: dict[str, str] = {}
    for f in list_files(store, f"v1/refs/{ACCEPTED}"):
        parts = f.rel.split("/")
        if len(parts) != 5 or parts[-1].startswith("."):
            continue
        found, damaged = _marks(store, Acceptance, f"{ACCEPTED}/{parts[3]}", [parts[4]])
        good |= found
        bad |= damaged
    return good, bad


# ---- tombstones ----------------------------------------------------------------------------

def bury(store: Store, manifests: Iterable[RunManifest], removed_at: str | None = None) -> None:
    """Writes the tombstones of runs gc is about to remove (before their manifests go: a
    tombstone of a run that still exists is harmless, readers look for the manifest first)."""
    when = removed_at or now_iso()
    runs: dict[str, bytes] = {}
    records: dict[str, bytes] = {}
    for m in manifests:
        data = _bytes(Tombstone(run_id=m.run_id, eval_set_id=m.eval_set_id,
                                record_id=m.record_oid, removed_at=when))
        runs[repo.ref_name(m.run_id)] = data
        records[repo.hexof(m.record_oid)] = data
    if runs:
        store.put_refs(TOMBSTONE_RUNS, runs)
        store.put_refs(TOMBSTONE_RECORDS, records)


def tombstone(store: Store, ref: str) -> Tombstone | None:
    """The tombstone gc left for run ``ref`` or record ``ref`` (``sha256:…`` or a unique hex
    prefix of 8 or more), or None; ``CorruptRecordError`` if it is damaged."""
    found = read_mark(store, Tombstone, TOMBSTONE_RUNS, repo.ref_name(ref))
    if found is not None:
        return found
    hex_part = repo.hexof(ref).lower()
    if len(hex_part) < 8 or any(c not in "0123456789abcdef" for c in hex_part):
        return None
    names = [n for n in store.list_refs(TOMBSTONE_RECORDS) if n.startswith(hex_part)]
    return read_mark(store, Tombstone, TOMBSTONE_RECORDS, names[0]) if len(names) == 1 else None


# ---- last-good -----------------------------------------------------------------------------

@dataclass(frozen=True)
class LastGood:
    """The last-good run of an eval set, and why it is."""

    manifest: RunManifest
    why: str


def accepted_why(mark: Acceptance) -> str:
    return f"accepted by {mark.by} on {mark.at[:10]}"


def pick_last_good(store: Store, candidates: Iterable[RunManifest],
                   acceptances: dict[str, Acceptance], good: GoodFn) -> LastGood | None:
    """The first of ``candidates`` (full runs of one eval set, newest first) that was
    accepted (``acceptances``, by run name) or passed its own gate (``good``). A run whose
    gate cannot be re-evaluated (its record or its baseline unreadable) is not good."""
    for manifest in candidates:
        mark = acceptances.get(repo.ref_name(manifest.run_id))
        if mark is not None and mark.record_id == manifest.record_oid:
            return LastGood(manifest, accepted_why(mark))
        try:
            if good(store, manifest):
                return LastGood(manifest, "passed its own gate")
        except EvalsnapError as exc:
            logger.warning("run %s: whether it passed its gate cannot be told (%s); "
                           "last-good looks at earlier runs", manifest.run_id, exc)
    return None


def last_good(store: Store, eval_set_id: str, good: GoodFn, *,
              exclude_run: str | None = None) -> LastGood | None:
    """The newest full run of ``eval_set_id`` (never ``exclude_run``) that was accepted or
    passed its own gate, looked at newest first until one is (a few reads); None if none."""
    acceptances, damaged = accepted(store, eval_set_id)
    for name, problem in damaged.items():
        logger.warning("ignoring the acceptance of run %s: %s", name, problem)
    return pick_last_good(store, repo.full_runs(store, eval_set_id, exclude_run=exclude_run),
                          acceptances, good)
