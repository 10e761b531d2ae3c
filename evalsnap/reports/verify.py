"""``evalsnap verify``: every object re-hashed and parsed, every run manifest followed.

Six passes, each reporting findings instead of stopping at the first one:

1. :meth:`storage.Store.verify` re-hashes every object file and flags stray files.
2. Every object that hashes correctly is parsed as its record type (a correct hash of bytes
   that are not a valid record, e.g. written by a buggy or newer evalsnap, is still wrong).
3. Every ref under ``runs/`` is read as a manifest: its checksum must hold, every object it
   lists must exist and be sound, and its record's links (snapshot, inference, units, judge
   ledger entries) must resolve to sound objects of the right kind.
4. Every index entry and segment must parse as one of its index (a bad one is harmless, it counts
   as absent, but it is damage all the same).
5. Every cached Prefect task result (``v1/prefect/``) must be a result record evalsnap wrote
   (:mod:`evalsnap.records.task_results`): an empty or unreadable one is only a cache entry
   (the task runs again), but it is damage, and deleting it clears it.
6. Every pin, acceptance and tombstone (:mod:`evalsnap.records.marks`) must parse as one and
   name the run it is filed under (a damaged pin or acceptance still keeps its run from gc,
   but ``last-good`` ignores a damaged acceptance).

Every read goes through the one parse of stored bytes (``parse_stored``), so a file that is
wrong in any way (not JSON, nested too deeply, not UTF-8, NaN) is a finding, never a crash.

Plain Python, no Prefect; the CLI command is a thin wrapper in :mod:`evalsnap.cli.store`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from evalsnap.errors import CorruptRecordError, EvalsnapError
from evalsnap.records import (
    EvaluationRecord,
    InferenceRecord,
    LedgerEntry,
    RunManifest,
    ScoreUnit,
    Snapshot,
    StoredModel,
    marks,
    outcomes,
    pack,
    repo,
    segments,
)
from evalsnap.records._base import parse_stored
from evalsnap.records.task_results import record_result
from evalsnap.reports.history import REPORTS
from storage import OBJECT_KINDS, InvalidId, Store, TooLarge
from storage.gc import list_files
from storage.ids import PACKED_KINDS

__all__ = ["Finding", "VerifyReport", "verify_store"]

RECORD_TYPES: dict[str, type[StoredModel]] = {
    "inference": InferenceRecord,
    "snapshot": Snapshot,
    "unit": ScoreUnit,
    "judge": LedgerEntry,
    "record": EvaluationRecord,
}


@dataclass(frozen=True)
class Finding:
    """One thing wrong with the store."""

    kind: str
    """Object kind, ``manifest`` for a run manifest, ``index`` for an index entry."""
    location: str
    """URL of the object or ref that is wrong (or that points at something wrong)."""
    message: str
    """What is wrong and what to do about it."""
    oid: str | None = None
    """The object id concerned, when there is one."""
    run_id: str | None = None
    """The run whose manifest is affected, when there is one."""


@dataclass
class VerifyReport:
    store: str
    objects: dict[str, int] = field(default_factory=dict)
    """Number of objects checked per kind."""
    runs: int = 0
    """Number of run manifests checked."""
    index_entries: int = 0
    """Number of index entries checked."""
    task_results: int = 0
    """Number of cached Prefect task results checked."""
    marks: int = 0
    """Number of pins, acceptances and tombstones checked."""
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What is missing but no problem (``ok`` stays true): a run's HTML page, which the run
    writes after its commit, best effort, and ``evalsnap report RUN --store-page`` writes
    again."""

    @property
    def ok(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, Any]:
        return {"store": self.store, "ok": self.ok, "objects": self.objects, "runs": self.runs,
                "index_entries": self.index_entries, "task_results": self.task_results,
                "marks": self.marks,
                "problems": [asdict(f) for f in self.findings], "notes": self.notes}


class _Objects:
    """Per kind: which oids exist, which are unsound (and why), and parsed records."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.present: dict[str, set[str]] = {}
        self.bad: dict[tuple[str, str], str] = {}
        self.parsed: dict[tuple[str, str], StoredModel] = {}
        self.held: dict[str, list[str]] = {}
        """Unit and judge entry oid → the sound packs holding it (its only copy, when no
        loose object is present)."""
        self.lost: list[tuple[str, str, str]] = []
        """(kind, oid, pack) of each member a damaged pack lost."""

    def problem(self, kind: str, oid: str, packs: Iterable[str] | None = None) -> str | None:
        """Why ``kind``/``oid`` cannot be used, or None if it is present and sound: a loose
        object, or (a unit or judge entry) a member of one of ``packs`` (any sound pack if
        None)."""
        if oid not in self.present.get(kind, set()) and kind in PACKED_KINDS \
                and oid in self.held:
            holders = self.held[oid]
            if packs is None or set(holders) & set(packs):
                return self._unsound(kind, oid)
            return (f"{kind} object {oid} is held only by pack(s) {', '.join(holders)}, which "
                    "its record does not name (readers look for it in the record's packs)")
        if oid not in self.present.get(kind, set()):
            where = " (no loose object, and no sound pack its record names holds it)" \
                if kind in PACKED_KINDS else ""
            return f"{kind} object {oid} is missing{where}"
        return self._unsound(kind, oid)

    def _unsound(self, kind: str, oid: str) -> str | None:
        if (kind, oid) in self.bad:
            return f"{kind} object {oid} is unsound: {self.bad[(kind, oid)]}"
        return None


def _scan_objects(store: Store, report: VerifyReport) -> _Objects:
    objects = _Objects(store)
    by_path = {}
    for problem in store.verify():
        oid = _oid_in(problem.path)
        if oid is not None:
            objects.bad[(problem.kind, oid)] = problem.message
            by_path[(problem.kind, oid)] = problem.path
        report.findings.append(Finding(problem.kind, problem.path, problem.message, oid))
    for kind in OBJECT_KINDS:
        oids = set(store.iter_objects(kind))
        objects.present[kind] = oids
        report.objects[kind] = len(oids)
        for oid in sorted(oids):
            if kind == pack.KIND:  # members checked, units and entries parsed (of a
                _scan_pack(store, oid, objects, report)  # damaged pack, the sound ones)
                continue
            if (kind, oid) in objects.bad:
                continue
            try:
                if kind == outcomes.KIND:  # a cached scoring result's rows: JSON data, a row
                    for _ in outcomes.stored_items(store, oid):  # a line, each let go of
                        pass
                    continue
                data = store.get_object(kind, oid)
                objects.parsed[(kind, oid)] = RECORD_TYPES[kind].from_bytes(data, where=oid)
            except (EvalsnapError, ValueError) as exc:
                # Hash fine but not a readable record, or corrupted since the first pass.
                objects.bad[(kind, oid)] = str(exc)
                report.findings.append(Finding(kind, store.object_url(kind, oid), str(exc), oid))
    for kind, oid, pack_oid in objects.lost:
        if oid in objects.held or oid in objects.present.get(kind, set()):
            continue  # a sound copy is there (a run did it again)
        report.findings.append(Finding(kind, store.object_url(pack.KIND, pack_oid),
                                       f"{kind} object {oid} in pack {pack_oid} is corrupt: its "
                                       "bytes no longer hash to its id; it is not used", oid))
    return objects


def _scan_pack(store: Store, pack_oid: str, objects: _Objects, report: VerifyReport) -> None:
    """A pack's members: each must be what its id says (a pack that hashes right but holds a
    member that does not was written so), and a unit or judge entry (whose only copy a pack
    may be) must parse as one. Of a damaged pack (reported by the first pass), the members
    that still match their ids count as held, as runs read them."""
    got = store.open_packs([pack_oid]).get(pack_oid)
    if isinstance(got, Exception) or got is None:
        if (pack.KIND, pack_oid) not in objects.bad:
            objects.bad[(pack.KIND, pack_oid)] = str(got)
            report.findings.append(Finding(pack.KIND, store.object_url(pack.KIND, pack_oid),
                                           str(got), pack_oid))
        return
    damaged = store.damaged_packs().get(pack_oid)
    if damaged is not None:  # each member it lost (with no sound copy elsewhere: see below)
        objects.lost += [(kind, oid, pack_oid) for kind, oid in pack.listed(damaged)
                         if (kind, oid) not in got and kind in OBJECT_KINDS]
    elif (pack.KIND, pack_oid) not in objects.bad:
        data = store.get_object(pack.KIND, pack_oid)
        raw = parse_stored(data, what=f"pack {pack_oid}")
        listed = raw.get("members") if isinstance(raw, dict) else None
        if isinstance(listed, list) and len(got) != len(listed):
            problem = (f"{len(listed) - len(got)} of its {len(listed)} members are not what "
                       "their ids say; they are not used (what they held is computed again)")
            objects.bad[(pack.KIND, pack_oid)] = problem
            report.findings.append(Finding(pack.KIND, store.object_url(pack.KIND, pack_oid),
                                           problem, pack_oid))
    for (kind, oid), body in got.items():
        if kind not in PACKED_KINDS:
            continue
        objects.held.setdefault(oid, []).append(pack_oid)
        if (kind, oid) in objects.parsed or (kind, oid) in objects.bad:
            continue
        try:
            objects.parsed[(kind, oid)] = RECORD_TYPES[kind].from_bytes(body, where=oid)
        except EvalsnapError as exc:
            objects.bad[(kind, oid)] = f"in pack {pack_oid}: {exc}"
            report.findings.append(Finding(kind, store.object_url(pack.KIND, pack_oid),
                                           f"member {oid}: {exc}", oid))


def _oid_in(path: str) -> str | None:
    parts = path.rstrip("/").split("/")
    if len(parts) >= 2 and len(parts[-2]) == 2 and len(parts[-1]) == 62:
        return f"sha256:{parts[-2]}{parts[-1]}"
    return None


def _in_the_future(stamp: str, slack_s: float = 3600.0) -> bool:
    """Whether an ISO 8601 time lies more than ``slack_s`` (clock skew) after now."""
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - datetime.now(UTC)).total_seconds() > slack_s


def _manifest_url(store: Store, name: str) -> str:
    return f"{store.url.rstrip('/')}/v1/refs/runs/{name}"


def _read_manifest(store: Store, name: str) -> tuple[RunManifest | None, str | None]:
    try:
        data = store.get_ref("runs", name)
    except TooLarge as exc:
        return None, str(exc)
    if data is None:
        return None, "disappeared while verifying; run verify again"
    try:
        manifest = RunManifest.from_bytes(data, where=f"runs/{name}")
    except EvalsnapError as exc:
        return None, f"unreadable manifest: {exc}"
    actual = repo.manifest_checksum(manifest)
    if manifest.checksum != actual:
        return None, (f"manifest checksum is {manifest.checksum or 'missing'} but its content "
                      f"hashes to {actual}: the manifest is corrupt; the run it names cannot "
                      "be trusted. Re-run it, then delete this ref")
    if manifest.run_id != name:
        return None, f"manifest names run {manifest.run_id!r}, not {name!r}"
    return manifest, None


def _links(record: EvaluationRecord, objects: _Objects) -> Iterable[tuple[str, str, str]]:
    """(kind, oid, what) for everything the record points at."""
    if record.snapshot_oid is not None:
        yield "snapshot", record.snapshot_oid, "its snapshot"
    elif record.kind != "import":
        yield "snapshot", "", "its snapshot (none given, but only imported records may omit it)"
    for inf in record.inference:
        yield "inference", inf.inference_oid, f"inference of {inf.eval_id} #{inf.repetition}"
    for ref in record.units:
        what = f"unit {ref.eval_id} #{ref.repetition} {ref.metric_name}"
        yield "unit", ref.unit_oid, what
        unit = objects.parsed.get(("unit", ref.unit_oid))
        if isinstance(unit, ScoreUnit):
            for entry in unit.ledger:
                yield "judge", entry, f"judge ledger entry of {what}"


def _check_manifest(store: Store, name: str, objects: _Objects,
                    report: VerifyReport) -> str | None:
    """Checks one run manifest and what it names; returns its record's id (None: unreadable)."""
    url = _manifest_url(store, name)
    manifest, error = _read_manifest(store, name)
    if manifest is None:
        report.findings.append(Finding("manifest", url, error or "unreadable", run_id=name))
        return None
    if _in_the_future(manifest.created_at):
        report.findings.append(Finding(
            "manifest", url, f"manifest says it was created at {manifest.created_at}, in the "
            "future: evalsnap never writes that (a wrong clock, or a planted file); `latest` "
            "and gc go by when the store wrote it, not by this date", run_id=name))
    listed = [(e.kind, e.oid, f"listed {e.kind} object") for e in manifest.objects]
    if ("record", manifest.record_oid) not in {(k, o) for k, o, _ in listed}:
        listed.append(("record", manifest.record_oid, "its record"))
    checks = list(listed)
    record = objects.parsed.get(("record", manifest.record_oid))
    if isinstance(record, EvaluationRecord):
        if record.run_id != manifest.run_id:
            report.findings.append(Finding(
                "manifest", url, f"record {manifest.record_oid} belongs to run "
                f"{record.run_id!r}, not {manifest.run_id!r}", manifest.record_oid, name))
        if record.snapshot_oid != manifest.snapshot_oid:
            report.findings.append(Finding(
                "manifest", url, f"manifest names snapshot {manifest.snapshot_oid} but its "
                f"record names {record.snapshot_oid}", manifest.record_oid, name))
        checks += list(_links(record, objects))
    seen: set[tuple[str, str]] = set()
    for kind, oid, what in checks:
        if (kind, oid) in seen:
            continue
        seen.add((kind, oid))
        problem = (f"{kind} object is not named" if not oid else
                   f"unknown object kind {kind!r}" if kind not in OBJECT_KINDS else
                   objects.problem(kind, oid, record.packs
                                   if isinstance(record, EvaluationRecord) else None))
        if problem:
            report.findings.append(Finding(
                "manifest", url, f"run {name}: {what}: {problem}; {_REPAIR.get(kind, _NO_REPAIR)}",
                oid or None, name))
    return manifest.record_oid


#: How a damaged object is repaired: objects hold no run id or time (``VOLATILE``), so the
#: same work writes the same bytes, which replace the damaged copy.
_REPAIR = {
    kind: "repair it by running the same eval set again with `--reuse --force` (sound "
          "inference is kept; scoring the same inference again writes the same object over "
          "the damaged one)" for kind in ("unit", "judge", "snapshot")}
_REPAIR[pack.KIND] = ("a run that does its lost members again rebuilds it: run the same eval "
                     "set again with `--reuse` (its sound members are reused, the others scored "
                     "again byte for byte)")
_NO_REPAIR = ("it cannot be written again byte for byte (an agent's inference, a record), so "
              "this run cannot be reproduced from the store; re-run the eval set (with --reuse, "
              "sound work is kept) and remove the damaged run with `evalsnap gc`")


def _check_indexes(store: Store, report: VerifyReport) -> None:
    for namespace in (*repo.INDEXES, segments.NAMESPACE):
        for name in store.list_refs(namespace):
            report.index_entries += 1
            try:
                data = store.get_ref(namespace, name)
                if data is None:
                    continue  # replaced or removed since the listing: nothing to check
                if namespace == segments.NAMESPACE:
                    segments.parse_segment(data, where=f"{namespace}/{name}")
                else:
                    repo.parse_index_entry(namespace, data, where=f"{namespace}/{name}")
            except (CorruptRecordError, TooLarge) as exc:
                url = f"{store.url.rstrip('/')}/v1/refs/{namespace}/{name}"
                report.findings.append(Finding("index", url, str(exc)))


def _check_task_results(store: Store, report: VerifyReport, objects: _Objects) -> None:
    for name in store.list_task_results():
        report.task_results += 1
        try:
            data = store.get_task_result(name)
            if data is None:
                continue  # replaced or removed since the listing
            result = record_result(data)
            if isinstance(result, dict):  # a scoring result: the handle of its outcomes
                oid = outcomes.handle_oid(result)
                problem = objects.problem(outcomes.KIND, oid) if oid is not None else \
                    "it names no stored outcomes"
                if problem is not None:
                    raise ValueError(problem)
                continue
            for _ in result:  # each item parsed and let go of in turn
                pass
        except (ValueError, RecursionError, TooLarge, InvalidId) as exc:
            url = f"{store.url.rstrip('/')}/v1/prefect/{name}"
            report.findings.append(Finding(
                "task_result", url, f"cached Prefect task result is unusable ({exc}); runs ignore "
                "it and run the task again; delete the file to clear this finding"))


def _check_marks(store: Store, report: VerifyReport) -> None:
    kinds: dict[str, type[marks.Mark]] = {marks.PINS: marks.Pin, marks.ACCEPTED: marks.Acceptance,
             marks.TOMBSTONE_RUNS: marks.Tombstone, marks.TOMBSTONE_RECORDS: marks.Tombstone}
    for top in ("pins", "accepted", "tombstones"):
        for f in list_files(store, f"v1/refs/{top}"):
            namespace, _, name = f.rel.removeprefix("v1/refs/").rpartition("/")
            if name.startswith("."):
                continue  # an interrupted write's temporary file: gc's business
            url = f"{store.url.rstrip('/')}/{f.rel}"
            cls: type[marks.Mark] | None = kinds.get(namespace) or (marks.Acceptance if namespace.startswith(
                f"{marks.ACCEPTED}/") and namespace.count("/") == 1 else None)
            report.marks += 1
            if cls is None:
                report.findings.append(Finding("mark", url, "not a file evalsnap writes here "
                                               "(pins/<run>, accepted/<eval set>/<run>, "
                                               "tombstones/runs|records/<name>); delete it"))
                continue
            try:
                marks.read_mark(store, cls, namespace, name)
            except (CorruptRecordError, InvalidId) as exc:
                report.findings.append(Finding("mark", url, str(exc)))


def verify_store(store: Store) -> VerifyReport:
    """Checks every object, run manifest and index entry of ``store``; never modifies it."""
    report = VerifyReport(store.url)
    objects = _scan_objects(store, report)
    names = store.list_refs("runs")
    report.runs = len(names)
    records = {name: _check_manifest(store, name, objects, report) for name in names}
    pages = set(store.list_refs(REPORTS))
    for name, record_oid in records.items():
        if record_oid and f"{record_oid.split(':', 1)[-1]}.html" not in pages:
            report.notes.append(
                f"run {name}: its HTML page is missing (a run writes it after its commit, "
                f"best effort); `evalsnap report {name} --store-page --store {store.url}` "
                "writes it again")
    _check_indexes(store, report)
    _check_task_results(store, report, objects)
    _check_marks(store, report)
    return report
