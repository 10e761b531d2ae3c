"""``evalsnap gc``: remove old runs and every object no kept run names, safely while others write.

Mark and sweep over one listing of the store (:func:`storage.gc.list_files`):

* **Runs kept.** Per eval set: the newest run, the newest *full* run (``latest`` and the
  default baseline), the run the eval set's ``latest`` pointer (``refs/index/evalset``)
  names, pinned and accepted runs and the ``last-good`` run (:mod:`evalsnap.records.marks`;
  a mark that cannot be read keeps the run it is filed under), the ``keep_last`` newest,
  those younger than ``older_than_days``, and every run whose manifest is younger than the
  grace period or cannot be read. The rest are removed, each after its tombstone is written
  (``refs/tombstones/…``: a later reference to it says when gc removed it); a run pinned or
  accepted while gc ran is spared, and then nothing else is swept. Pins, acceptances and
  tombstones are never removed.
* **Marked.** Everything a kept run names, followed through the records: manifest → record
  → snapshot, inference, units → judge ledger entries → the entry a ledger answer was
  copied from (``reused_from``); the same from every object, index entry and Prefect result
  younger than the grace period (a run still writing: its objects exist before its manifest).
  Provenance pointers (``parent_record``, ``reused_from_record``, ``baseline``) are not
  followed: an earlier record is kept only if its own run is.
* **Swept**, when older than the grace period and not marked: objects; index entries whose
  object goes (or that are damaged); Prefect task results naming an object that goes (or
  not ours); the HTML report and history point (``refs/reports/<record hex>.html|.json``) and the in-store ADK
  history copy of a record that goes; temporary files left by interrupted writes.
* **Objects wait for quiet.** A run may hold an id it read from an index before gc removed
  the entry (or the object it names) and name it in its manifest later. So objects, index
  entries and cached results are removed only when the latest writing command started more
  than the grace period ago (each rewrites ``v1/STORE`` first, :meth:`storage.Store.check`);
  otherwise only runs, their reports and history copies go, the rest is reported as
  deferred for a later gc. A run that takes less than the grace period loses nothing.
  Damage (a kept object or a manifest that cannot be read) defers them too: gc cannot know
  what it names.
* **A writer that starts during gc stops the sweep.** gc reads ``v1/STORE`` again before
  every batch of index entries, cached results and objects; once a writer has started since
  gc began, the rest of them is deferred. Index entries and cached results (the only ways a
  run finds an object it did not make) go before any object, so a run that found one has
  rewritten ``v1/STORE`` before the next check. A run that makes an object byte for byte
  again freshens it (local disk, :func:`storage._local.remove`). ``docs/gc.md`` has the
  argument.

Deletion order: run manifests first, then refs, then objects (records first), so a reader
never finds a manifest naming a missing object, and a gc killed half-way leaves only
unreferenced objects for the next one. Local directories are never removed (a writer may
be about to create a file in one).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from evalsnap.errors import CorruptRecordError, UsageError
from evalsnap.records import RunManifest, marks, repo, segments
from evalsnap.records._gc_mark import (
    INDEX_KINDS,
    MARKS,
    Listing,
    Marker,
    classify,
    read_ref,
    read_run,
    ref_target,
)
from storage import Store
from storage.gc import (
    StoredFile,
    delete_files,
    freshens_rewrites,
    list_files,
    marker_written_at,
)

__all__ = ["DEFAULT_GRACE", "GcReport", "collect", "parse_duration"]

logger = logging.getLogger(__name__)

DEFAULT_GRACE = 3600.0
"""Seconds: nothing younger is removed; keep it above the longest run."""
_DAY = 86400.0
_WORKERS = 8
_BATCH = 256
"""Files deleted between two reads of ``v1/STORE`` (index entries, cached results, objects)."""
_STEP = 2.0
"""Seconds: S3 dates an object to the second, so a marker written this close to gc's start
may hide a writer that started after gc read it."""
_REPORT = re.compile(r"^([0-9a-f]{64})\.(?:html|json)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: Rows of the table, in this order. ``other`` files are left alone.
KINDS = ("run", "record", "snapshot", "inference", "unit", "judge", "pack", "outcomes",
         *INDEX_KINDS,
         "prefect result", "report", "adk history", *MARKS.values(), "temporary file")
_WAITING = (*INDEX_KINDS, "prefect result")
_OBJECTS = ("record", "snapshot", "unit", "judge", "inference", "pack", "outcomes")
_DELETE_ORDER = ("run", *INDEX_KINDS, "prefect result", "report", "adk history",
                 "temporary file", "record", "outcomes", "pack", "snapshot", "unit", "judge",
                 "inference")


def parse_duration(text: str) -> float:
    """``90``, ``45s``, ``30m``, ``1h``, ``2d`` → seconds (``UsageError`` otherwise)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
    if not match:
        raise UsageError(f"grace period {text!r} is not a duration; write e.g. 0, 90s, 30m, "
                         "1h or 2d.")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


@dataclass
class KindCount:
    kept: int = 0
    removed: int = 0
    bytes: int = 0
    """Bytes removed (with ``dry_run``: that would be)."""
    deferred: int = 0
    """Not named by a kept run, but left: younger than the grace period, or objects while a
    writer may be running."""


@dataclass
class GcReport:
    store: str
    dry_run: bool
    grace_seconds: float
    writer_started_ago: float | None
    """Seconds since the latest writing command started (``v1/STORE``), if known."""
    objects_deferred: str | None = None
    """Why no object was removed this time, if none was."""
    runs_kept: list[dict[str, Any]] = field(default_factory=list)
    runs_removed: list[dict[str, Any]] = field(default_factory=list)
    kinds: dict[str, KindCount] = field(default_factory=lambda: {k: KindCount() for k in KINDS})
    removed: list[str] = field(default_factory=list)
    """URL of every file removed (with ``dry_run``: that would be)."""
    warnings: list[str] = field(default_factory=list)
    tombstones_written: int = 0
    """Runs removed by this gc whose tombstone it wrote (none with ``dry_run``)."""

    @property
    def removed_count(self) -> int:
        return sum(k.removed for k in self.kinds.values())

    @property
    def removed_bytes(self) -> int:
        return sum(k.bytes for k in self.kinds.values())

    def as_dict(self) -> dict[str, Any]:
        return {"store": self.store, "dry_run": self.dry_run, "grace_seconds": self.grace_seconds,
                "writer_started_ago": self.writer_started_ago,
                "objects_deferred": self.objects_deferred, "runs_kept": self.runs_kept,
                "runs_removed": self.runs_removed, "removed_count": self.removed_count,
                "removed_bytes": self.removed_bytes,
                "kinds": {k: asdict(v) for k, v in self.kinds.items()},
                "removed": self.removed, "warnings": self.warnings,
                "tombstones_written": self.tombstones_written}


def _age_days(manifest: RunManifest, f: StoredFile, now: float) -> float:
    """A run's age by when the store wrote its manifest (what a manifest claims of itself
    can be planted: issue 29 item 11); by its ``created_at`` only where the store says
    nothing."""
    if f.modified is not None:
        return (now - f.modified) / _DAY
    try:
        created = dt.datetime.fromisoformat(manifest.created_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        created = now
    return (now - created) / _DAY


def _by_set(manifests: dict[str, RunManifest], listing: Listing
            ) -> list[list[tuple[str, RunManifest]]]:
    """The runs of each eval set, newest first by the store's own clock, as `latest`
    (repo._newest_first), never by the date a manifest claims."""
    by_set: dict[str, list[tuple[str, RunManifest]]] = defaultdict(list)
    for name, m in manifests.items():
        by_set[m.eval_set_id].append((name, m))
    for runs in by_set.values():
        runs.sort(key=lambda r: (listing.runs[r[0]].modified or 0.0, r[0]), reverse=True)
    return list(by_set.values())


def _retain(manifests: dict[str, RunManifest], listing: Listing, pointed: set[str], *,
            keep_last: int | None, older_than_days: float | None,
            young: Callable[[StoredFile], bool], now: float,
            sticky: dict[str, str] | None = None) -> dict[str, str | None]:
    """Why each readable run is kept, or None if it goes (``sticky``: runs kept whatever the
    rules say, and why: pinned, accepted, the last-good of its eval set)."""
    sticky = sticky or {}
    why: dict[str, str | None] = {}
    for runs in _by_set(manifests, listing):
        # RunManifest.full (coverage) may be absent: such runs read as full
        newest_full = next((n for n, m in runs if getattr(m, "full", None) is not False), None)
        for i, (name, m) in enumerate(runs):
            f = listing.runs[name]
            reasons = [
                (i == 0, "newest of its eval set"),
                (name == newest_full, "newest full run of its eval set (latest, baseline)"),
                (m.run_id in pointed, "named by the eval set's latest pointer"),
                (name in sticky, sticky.get(name, "")),
                (keep_last is not None and i < keep_last, f"among the newest {keep_last}"),
                (older_than_days is not None and _age_days(m, f, now) < older_than_days,
                 f"younger than {older_than_days or 0:g} days"),
                (young(f), "written within the grace period"),
            ]
            why[name] = next((text for hit, text in reasons if hit), None)
    return why


def collect(store: Store, *, good: marks.GoodFn, keep_last: int | None = None,
            older_than_days: float | None = None, grace: float = DEFAULT_GRACE,
            dry_run: bool = False) -> GcReport:
    """Removes the runs the rules do not keep and every file nothing kept names (see the
    module docstring); with ``dry_run`` only reports what would go. ``good`` says whether a
    run passed its own gate (:func:`evalsnap.reports.lastgood.is_good`): the last-good run
    of each eval set is kept."""
    if keep_last is None and older_than_days is None:
        raise UsageError("say which runs to keep: --keep-last N (the newest N of each eval "
                         "set) and/or --older-than DAYS (remove runs older than that).")
    if keep_last is not None and keep_last < 1:
        raise UsageError(f"--keep-last {keep_last}: keep at least 1 run per eval set (the "
                         "newest is always kept).")
    if older_than_days is not None and not (math.isfinite(older_than_days)
                                            and older_than_days >= 0):
        raise UsageError(f"--older-than {older_than_days}: give a number of days, 0 or more "
                         "(e.g. 30 or 0.5).")
    if not (math.isfinite(grace) and grace >= 0):
        raise UsageError(f"--grace {grace}: give a duration, 0 or more (e.g. 1h).")
    gc = _Gc(store, grace, dry_run, good)
    with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
        gc.marker = Marker(store, gc.listing, pool)
        gc.read(pool)
        gc.retain(keep_last, older_than_days)
        gc.marker.mark(gc.roots)
    gc.decide()
    gc.sweep()
    return gc.report


class _Gc:
    """One collection: what was listed and read, what is kept, what goes."""

    def __init__(self, store: Store, grace: float, dry_run: bool, good: marks.GoodFn) -> None:
        self.store, self.grace, self.dry_run, self.good = store, grace, dry_run, good
        self.halted = False
        """A run was pinned or accepted after gc read the marks: it is spared, and nothing
        but the other runs' manifests is removed this time."""
        self.now = time.time()
        self.marker_at = marker_written_at(store)
        marker = self.marker_at
        self.report = GcReport(store.url, dry_run, grace,
                               None if marker is None else max(0.0, self.now - marker))
        self.listing = classify(list_files(store, "v1"))
        self.marker: Marker
        self.manifests: dict[str, RunManifest] = {}
        self.why: dict[str, str | None] = {}
        self.roots: set[str] = set()
        self.pointed: set[str] = set()
        self.refs = self.listing.refs
        self.datas: list[bytes | None] = []
        self.targets: list[set[str] | None] = []
        self.doomed: dict[str, list[StoredFile]] = defaultdict(list)

    def young(self, f: StoredFile) -> bool:
        return f.modified is None or self.now - f.modified < self.grace

    def read(self, pool: ThreadPoolExecutor) -> None:
        """Every manifest and every ref gc must understand; roots from the refs."""
        names = list(self.listing.runs)
        for name, result in zip(names, pool.map(lambda n: read_run(self.store, n), names),
                                strict=True):
            if isinstance(result, RunManifest):
                self.manifests[name] = result
            elif isinstance(result, set):
                self.roots |= result
                self.report.warnings.append(f"run {name}: its manifest cannot be read; it is "
                                            "kept, with every object it seems to name (run "
                                            "`evalsnap verify`)")
                self.report.runs_kept.append({"run_id": name, "why": "manifest cannot be read"})
            elif result is False:
                self.marker.damaged.append(f"run {name}: its manifest does not parse")
        self.datas = list(pool.map(lambda r: read_ref(self.store, r[0], r[1]), self.refs))
        self.targets = [ref_target(kind, data, f"{kind}/{name}")
                        for (kind, name, _), data in zip(self.refs, self.datas, strict=True)]
        for (kind, _, f), data, named in zip(self.refs, self.datas, self.targets, strict=True):
            if kind == "index/evalset" and named:
                self.roots |= named  # latest of each eval set: always kept
                entry = repo.parse_index_entry(kind, data or b"{}", where=kind)
                self.pointed.add(str(entry.get("run_id")))
            elif named and self.young(f):
                self.roots |= named  # a run still writing
        self.roots |= {key.split(" ", 1)[1] for key, f in self.listing.objects.items()
                       if self.young(f)}

    def sticky(self) -> dict[str, str]:
        """Runs kept whatever the rules say, and why: pinned, accepted, and the last-good of
        each eval set (:mod:`evalsnap.records.marks`). A pin or acceptance that cannot be
        read keeps the run it is filed under (keeping too much is safe)."""
        why: dict[str, list[str]] = defaultdict(list)
        acceptances: dict[str, marks.Acceptance] = {}
        for kind, name, _ in sorted(self.refs, key=lambda r: r[0] != "pin"):  # pins first
            if kind not in ("pin", "accepted"):
                continue
            folder, _, run = name.rpartition("/")
            namespace = marks.PINS if kind == "pin" else f"{marks.ACCEPTED}/{folder}"
            cls: type[marks.Pin] | type[marks.Acceptance] = \
                marks.Pin if kind == "pin" else marks.Acceptance
            try:
                mark = marks.read_mark(self.store, cls, namespace, run)
            except CorruptRecordError as exc:
                self.report.warnings.append(f"{kind} of run {run} cannot be read; the run is "
                                            f"kept: {exc}")
                why[run].append(f"{'pinned' if kind == 'pin' else 'accepted'} (its mark "
                                "cannot be read; run `evalsnap verify`)")
                continue
            if isinstance(mark, marks.Pin):
                why[run].append(f"pinned ({mark.label})" if mark.label else "pinned")
            elif isinstance(mark, marks.Acceptance):
                acceptances[run] = mark
                why[run].append(marks.accepted_why(mark))
        for runs in _by_set(self.manifests, self.listing):
            full = [m for _, m in runs if getattr(m, "full", None) is not False]
            found = marks.pick_last_good(self.store, full, acceptances, self.good)
            name = repo.ref_name(found.manifest.run_id) if found is not None else ""
            if found is not None and name not in why:
                why[name].append("last-good of its eval set")
        return {name: "; ".join(reasons) for name, reasons in why.items()}

    def retain(self, keep_last: int | None, older_than_days: float | None) -> None:
        self.why = _retain(self.manifests, self.listing, self.pointed, keep_last=keep_last,
                           older_than_days=older_than_days, young=self.young, now=self.now,
                           sticky=self.sticky())
        for name, m in sorted(self.manifests.items(), key=lambda i: i[1].created_at,
                              reverse=True):
            entry = {"run_id": m.run_id, "eval_set_id": m.eval_set_id,
                     "created_at": m.created_at, "record_id": m.record_oid}
            if self.why[name] is None:
                self.report.runs_removed.append(entry)
            else:
                self.report.runs_kept.append({**entry, "why": self.why[name]})
                self.roots |= {m.record_oid, m.snapshot_oid or "", *(e.oid for e in m.objects)}

    def _count(self, kind: str, f: StoredFile, keep: bool, defer: bool = False) -> None:
        count = self.report.kinds[kind]
        if keep:
            count.kept += 1
        elif defer or self.young(f):
            count.deferred += 1
        else:
            count.removed += 1
            count.bytes += f.size
            self.doomed[kind].append(f)

    def decide(self) -> None:
        marked, history, report = self.marker.marked, self.marker.history, self.report
        report.warnings += [f"cannot read {d}; objects are kept this time"
                            for d in self.marker.damaged]
        if self.marker.damaged:
            report.objects_deferred = "something gc must follow cannot be read (see warnings)"
        elif report.writer_started_ago is None and self.listing.objects:
            report.objects_deferred = ("v1/STORE is missing, so gc cannot tell when a run last "
                                       "started; any run or rescore writes it again")
        elif report.writer_started_ago is not None and report.writer_started_ago < self.grace:
            report.objects_deferred = (
                f"a writing command started {report.writer_started_ago:.0f} s ago, within the "
                "grace period: objects, index entries and cached results wait for a gc when "
                "no run may be writing")
        waiting = report.objects_deferred is not None
        for name, f in self.listing.runs.items():
            self._count("run", f, name not in self.manifests or self.why[name] is not None)
        for (kind, name, f), named in zip(self.refs, self.targets, strict=True):
            if kind == "report":
                hit = _REPORT.match(name)
                keep = not hit or f"sha256:{hit.group(1)}" in marked
            elif kind == "adk history":
                keep = name in history or name.removesuffix(".evalset_result.json") in history
            elif kind in MARKS.values():
                keep = True  # pins, acceptances and tombstones are never removed
            else:
                # a segment indexes many units: kept while it names any object kept
                keep = kind == "index/evalset" or bool(named and (
                    named & marked if kind == segments.NAMESPACE else named <= marked))
            # a running run may reuse through an index or cached result: they wait too
            self._count(kind, f, keep, defer=kind in _WAITING and waiting)
        for f in self.listing.temporary:
            self._count("temporary file", f, False)
        for key, f in self.listing.objects.items():
            kind, oid = key.split(" ", 1)
            self._count(kind, f, oid in marked, defer=waiting)

    def writer_started(self) -> bool:
        """Whether a writing command may have started since gc began (``v1/STORE``)."""
        marker = marker_written_at(self.store)
        return marker is None or marker != self.marker_at or self.now - marker < _STEP

    def sweep(self) -> None:
        """Deletes what :meth:`decide` doomed, in :data:`_DELETE_ORDER`; index entries,
        cached results and objects in batches, each after a fresh look at ``v1/STORE``."""
        before = {f.rel: data for (_, _, f), data in zip(self.refs, self.datas, strict=True)}
        stopped = False
        if self.doomed.get("run") and not self.dry_run:
            self.doomed["run"] = self.bury(self.doomed["run"])
        for kind in _DELETE_ORDER:
            files, count = self.doomed.get(kind, []), self.report.kinds[kind]
            if self.halted and kind != "run":
                _defer(count, files)
                continue
            waits = kind in _WAITING or kind in _OBJECTS
            size = _BATCH if waits else max(1, len(files))
            for start in range(0, len(files), size):
                batch = files[start:start + size]
                if waits and not self.dry_run and (stopped or self.writer_started()):
                    stopped = True
                    _defer(count, files[start:])
                    break
                if not self.dry_run and (kind in INDEX_KINDS or kind == "prefect result"):
                    batch = _unchanged(self.store, kind, batch, before, count)
                if batch and not self.dry_run:
                    gone = delete_files(self.store, batch, unless_freshened=kind in _OBJECTS)
                    _kept(count, list(set(batch) - set(gone)))
                    batch = gone
                self.report.removed += [self.store._url(f.rel) for f in batch]
        if self.halted:
            self.report.objects_deferred = (
                "a run gc was about to remove was pinned or accepted while gc ran: it is kept, "
                "and every other file waits for the next gc")
        elif stopped:
            self.report.objects_deferred = (
                "a writing command (run, rescore, import-adk-history) started while gc ran: "
                "what was left of the objects, index entries and cached results waits for a "
                "gc when no run may be writing")
        elif not self.dry_run and not freshens_rewrites(self.store) \
                and any(self.doomed.get(k) for k in _OBJECTS) and self.writer_started():
            self.report.warnings.append(
                "a writing command started while gc removed its last objects; if `evalsnap "
                "verify` then names a missing object, run that command again with --reuse "
                "(it writes again what it names)")


    def bury(self, files: list[StoredFile]) -> list[StoredFile]:
        """The manifests to delete, once their tombstones are written (before any is
        deleted: a crash between leaves tombstones of runs that still exist, which readers
        ignore). A run pinned or accepted since gc read the marks is spared (and
        :attr:`halted`: nothing it names may go now)."""
        late = {n for n in self.store.list_refs(marks.PINS)}
        late |= {f.rel.rsplit("/", 1)[-1] for f in list_files(self.store,
                                                                f"v1/refs/{marks.ACCEPTED}")}
        spared = [f for f in files if f.rel.rsplit("/", 1)[-1] in late]
        if spared:
            self.halted = True
            names = {f.rel.rsplit("/", 1)[-1] for f in spared}
            _kept(self.report.kinds["run"], spared)
            for entry in [r for r in self.report.runs_removed if r["run_id"] in names]:
                self.report.runs_removed.remove(entry)
                self.report.runs_kept.append({**entry, "why": "pinned or accepted while gc ran"})
            files = [f for f in files if f not in spared]
        doomed = [self.manifests[f.rel.rsplit("/", 1)[-1]] for f in files]
        marks.bury(self.store, doomed, marks.now_iso())
        self.report.tombstones_written = len(doomed)
        return files


def _defer(count: KindCount, files: list[StoredFile]) -> None:
    count.removed -= len(files)
    count.bytes -= sum(f.size for f in files)
    count.deferred += len(files)


def _kept(count: KindCount, files: list[StoredFile]) -> None:
    """Files that were written again since the listing (local objects): they stay."""
    count.removed -= len(files)
    count.bytes -= sum(f.size for f in files)
    count.kept += len(files)


def _unchanged(store: Store, kind: str, files: list[StoredFile], before: dict[str, bytes | None],
               count: KindCount) -> list[StoredFile]:
    """The refs that still hold what gc read: one a run has just rewritten is left alone."""
    keep = []
    for f in files:
        if read_ref(store, kind, f.rel.rsplit("/", 1)[-1]) == before.get(f.rel):
            keep.append(f)
        else:
            count.removed, count.bytes, count.kept = (count.removed - 1, count.bytes - f.size,
                                                      count.kept + 1)
    return keep


def gc_table(report: GcReport) -> Any:
    """The rich table of a report: one row per kind of file."""
    from rich.table import Table

    verb = "would remove" if report.dry_run else "removed"
    table = Table(title=f"gc of {report.store}" + (" (dry run)" if report.dry_run else ""))
    for name, justify in (("kind", "left"), ("kept", "right"), (verb, "right"),
                          ("bytes", "right"), ("deferred", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for kind, c in report.kinds.items():
        if c.kept or c.removed or c.deferred:
            table.add_row(kind, str(c.kept), str(c.removed), f"{c.bytes:,}", str(c.deferred))
    deferred = sum(c.deferred for c in report.kinds.values())
    table.caption = (f"{report.removed_count} file(s), {report.removed_bytes:,} bytes {verb}; "
                     f"{len(report.runs_kept)} run(s) kept, {len(report.runs_removed)} "
                     f"{verb}; grace {report.grace_seconds:g} s"
                     + (f"; {deferred} file(s) named by no kept run were kept: younger than the "
                        f"{report.grace_seconds:g} s grace period, or written while a run may "
                        "have been writing (a later gc removes them)" if deferred else ""))
    return table
