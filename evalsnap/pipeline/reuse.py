"""The one reuse authority: every decision to use earlier work instead of doing it again.

The rules (DESIGN.md "Reuse rules"), each decided here and nowhere else:

* **Inference** is reused only with ``reuse``, when the inference index names a record
  with the same fingerprint that hash-verifies, parses and succeeded.
* **A score unit** is reused only with ``reuse`` and without ``force``, when the metric's
  evaluator is trusted (a built-in, or a custom metric with a declared version), and the
  unit index names a *complete* unit with the same key that hash-verifies and parses.
* **A judge sample** is answered from the ledger only with ``reuse`` and without
  ``force``, by an earlier successful, parsed entry for the same request key and sample.

Prefect's task cache mirrors these decisions; it never makes one of its own:

* its keys come from :func:`inference_cache_key` and :func:`score_cache_key`, which give
  no key (no cache read, no write) with ``force`` or for an untrusted evaluator, and
  :func:`refresh_cache` lets a run without ``reuse`` write its results but never read one;
* a task result is written to the cache only when :func:`cacheable` (every inference
  succeeded, every unit complete), and a cached result is used only when
  :func:`cache_hit_usable`: it names exactly what the indexes above would hand out, so a
  damaged, missing, superseded or crafted entry counts as absent and the task runs again.

Nothing here imports code named in the store: records are parsed as data.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import ValidationError

from evalsnap.errors import EvalsnapError
from evalsnap.fingerprint import unit_fingerprint
from evalsnap.pipeline import hints, ledger
from evalsnap.pipeline.context import RunContext
from evalsnap.pipeline.judge import LedgerSource
from evalsnap.pipeline.outcomes import InferenceOutcome, UnitOutcome
from evalsnap.records import FrozenCase, InferenceRecord, MetricRule, ScoreUnit, outcomes, repo
from evalsnap.rows import Rows
from storage import Store

logger = logging.getLogger(__name__)


# ---- inference ------------------------------------------------------------------------------

def usable_inference(store: Store, oid: str, fingerprint: str) -> InferenceRecord | None:
    """The record ``oid`` if it hash-verifies, parses, succeeded and has this fingerprint."""
    try:
        record = repo.get_inference(store, oid)
    except EvalsnapError as exc:
        logger.warning("inference %s unusable (%s); running the agent again", oid, exc)
        return None
    return record if record.ok and record.inference_fingerprint == fingerprint else None


def find_inference(store: Store, fingerprint: str) -> tuple[str, InferenceRecord] | None:
    """The indexed, verified, successful inference with this fingerprint, if any (the entry
    and the object proved in bulk by :func:`hints.prime` where it ran, else read now)."""
    known = hints.hints_of(store)
    hint = known.inferences.get(fingerprint)
    entry = hint[1] if hint is not None else repo.inference_index_entry(store, fingerprint)
    oid = entry.get("oid") if entry else None
    record = usable_inference(store, oid, fingerprint) if isinstance(oid, str) else None
    if record is None and fingerprint in known.committed_inferences:
        # the entry names nothing usable (a killed run's object, removed by gc) while the
        # previous committed record has one: the index is rebuilt from what a manifest names
        oid, entry = known.committed_inferences[fingerprint]
        record = usable_inference(store, oid, fingerprint)
        if record is not None:
            repo.write_index_entry(store, "index/inference", repo.hexof(fingerprint), entry)
    return (oid, record) if record is not None else None  # type: ignore[return-value]


def inference_to_use(store: Store, fingerprint: str, *, reuse: bool, run_id: str,
                     attempt: int) -> tuple[str, InferenceRecord] | None:
    """The stored inference to use instead of running the agent: with ``reuse`` any usable
    one; on a retry (``attempt`` > 1) without reuse, only one this run made itself."""
    if not reuse and attempt <= 1:
        return None
    found = find_inference(store, fingerprint)
    if found is None or (not reuse and found[1].run_id != run_id):
        return None
    return found


# ---- score units ----------------------------------------------------------------------------

def why_not_reused(rule: MetricRule, *, reuse: bool, force: bool) -> str | None:
    """Why no unit of this metric may be reused in this run, or None if units may be."""
    if force:
        return "forced"
    if not reuse:
        return "reuse not requested"
    if not rule.evaluator.trusted:
        return "no trusted version"
    return None


def find_unit(store: Store, ufp: str) -> tuple[str, ScoreUnit, dict[str, Any]] | str:
    """The indexed, verified, complete unit with key ``ufp`` (id, unit, index entry); else
    why there is none (``"new"`` or ``"incomplete before"``). The eval set's previous record
    names it (a hint, proved in bulk), else the unit index: its candidates best first, the
    first that verifies (a newer one gc removed, or damaged, gives way to an older one)."""
    hint = hints.hints_of(store).units.get(ufp)
    candidates = [hint[1]] if hint is not None else []
    if not candidates or not candidates[0].get("complete"):
        candidates += repo.unit_index_entries(store, ufp)
    why = "new"
    for entry in candidates:
        oid = entry.get("unit_oid")
        if not isinstance(oid, str):
            continue
        if not entry.get("complete"):
            why = "incomplete before"
            continue
        unit = repo.load_unit(store, oid)
        if unit is None:
            continue  # damaged or missing: absent
        if not unit.complete or unit.unit_fingerprint != ufp:
            why = "incomplete before"
            continue
        return oid, unit, entry
    return why


def reusable_unit(store: Store, rule: MetricRule, frozen: FrozenCase, *, reuse: bool,
                  force: bool) -> tuple[UnitOutcome | None, str]:
    """A complete earlier unit to reuse for ``rule`` on ``frozen``, or why there is none."""
    why = why_not_reused(rule, reuse=reuse, force=force)
    if why is not None:
        return None, why
    ufp = unit_fingerprint(frozen.case_fingerprint, rule.rule_fingerprint)
    found = find_unit(store, ufp)
    if isinstance(found, str):
        return None, found
    oid, unit, entry = found
    packs = store.packs_holding(oid)  # none for a loose unit, or one in a damaged pack
    if not packs and store.in_damaged_pack(oid) and not _copied_out(store, oid, unit):
        return None, "new"
    return UnitOutcome(
        eval_id=frozen.eval_id, repetition=frozen.repetition, metric_name=rule.metric_name,
        unit_oid=oid, unit_fingerprint=ufp, case_fingerprint=frozen.case_fingerprint,
        rule_fingerprint=rule.rule_fingerprint, complete=True, status=unit.status,
        score=unit.score, run_id=entry["run_id"], reused_from_record=entry.get("record_oid"),
        why="reused", packs=packs), "reused"


def _copied_out(store: Store, oid: str, unit: ScoreUnit) -> bool:
    """A sound unit read from a damaged pack (its own member matched its id) gets loose
    copies of itself and its ledger entries, so that the record reusing it names no damaged
    pack; False (the unit is scored again) if an entry of its ledger is not sound."""
    try:
        entries = [store.get_object("judge", e) for e in unit.ledger]
    except EvalsnapError as exc:
        logger.warning("unit %s: a ledger entry is unusable (%s); scoring again", oid, exc)
        return False
    store.put_objects("judge", entries)
    store.put_object("unit", store.get_object("unit", oid))
    return True


# ---- judge samples --------------------------------------------------------------------------

def judge_answers(store: Store, *, reuse: bool, force: bool) -> LedgerSource | None:
    """Where a judge request may be answered from instead of the model (None: the model)."""
    return ledger.reuse_source(store) if reuse and not force else None


# ---- Prefect's task cache -------------------------------------------------------------------

def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def inference_key(fingerprints: list[str]) -> str:
    return f"infer-{_digest(fingerprints)}"


def score_key(metric_name: str, units: list[tuple[str, int, str]]) -> str:
    """The cache key of a metric's scoring task: its units' (eval id, repetition, unit
    fingerprint), in order. The case and repetition are part of it: a fingerprint is the
    unit's *content*, and two repetitions (two ``--until-stable`` rounds) whose answers are
    alike have the same fingerprints, while their outcomes name different repetitions."""
    return _score_key(metric_name, units_digest(units))


def _score_key(metric_name: str, digest: str) -> str:
    return f"score-{_digest([metric_name, digest])}"


def units_digest(units: list[tuple[str, int, str]]) -> str:
    """What a score request carries instead of its unit keys (see :func:`score_key`)."""
    return _digest([json.dumps([eval_id, repetition, fp]) for eval_id, repetition, fp in units])


def inference_cache_key(context: Any, parameters: dict[str, Any]) -> str | None:
    """Prefect ``cache_key_fn`` of an inference batch: its cases' inference fingerprints."""
    return inference_key([item.fingerprint for item in parameters["request"].items])


def score_cache_key(context: Any, parameters: dict[str, Any]) -> str | None:
    """Prefect ``cache_key_fn`` of a metric's scoring task: none with ``force`` or for an
    untrusted evaluator (never cached, never read)."""
    req = parameters["request"]
    if req.force or not req.trusted:
        return None
    return _score_key(req.metric_name, req.units_digest)


def refresh_cache(request: Any) -> bool:
    """Whether a task may only *write* its cache entry, not read one: without ``reuse``
    (or with ``force``) the work is done again, and what it produced is cached for later
    runs that reuse."""
    return not request.reuse or bool(getattr(request, "force", False))


def _outcomes(key: str, items: Iterable[Any]) -> Iterator[InferenceOutcome | UnitOutcome]:
    """The items of a result cached under ``key`` as their models, one at a time
    (``ValidationError``, ``TypeError`` or ``ValueError`` for an item that is not one)."""
    model = InferenceOutcome if key.startswith("infer-") else UnitOutcome
    for item in items:
        yield model.model_validate(item)


def cacheable(key: str, value: Iterable[Any]) -> bool:
    """Whether a task's result may be written to Prefect's cache under ``key``: its items
    (a list, or an iterable read once, an item at a time: a metric's result holds a row per
    case) are each an outcome, all of one metric, each complete (an inference a success),
    and together they make ``key``."""
    if not key.startswith(("infer-", "score-")) or isinstance(value, str | bytes | dict):
        return False
    lines = hashlib.sha256()  # _digest of the items' lines, as they come
    names: set[str] = set()
    count = 0
    try:
        for o in _outcomes(key, value):
            if isinstance(o, InferenceOutcome):
                line, done = o.fingerprint, o.status == "success"
            else:
                names.add(o.metric_name)
                line, done = json.dumps([o.eval_id, o.repetition, o.unit_fingerprint]), o.complete
            if not done or len(names) > 1:
                return False
            lines.update((b"\n" if count else b"") + line.encode())
            count += 1
    except (ValidationError, TypeError, ValueError, RecursionError):
        return False
    if not count:
        return False
    if key.startswith("infer-"):
        return key == f"infer-{lines.hexdigest()}"
    return key == _score_key(names.pop(), lines.hexdigest())


def keep_outcomes(ctx: RunContext, key: str | None, rows: Rows[UnitOutcome]) -> None:
    """Keeps a scoring task's rows for Prefect's cache (:mod:`evalsnap.records.outcomes`):
    if they may be cached under ``key`` (:func:`cacheable`) they are written as one object,
    a row at a time, and ``rows.kept`` is the handle that names it, which the cached result
    holds instead of the rows (and which the run's result storage, in this process, writes
    under ``key`` alone); else nothing is written and the handle names nothing."""
    if key is None or not cacheable(key, rows):
        rows.kept = outcomes.handle(None, len(rows))
        return
    oid = ctx.store.put_object_streamed(outcomes.KIND, outcomes.encode(rows.json_items()))
    ctx.kept_outcomes[oid] = key
    rows.kept = outcomes.handle(oid, len(rows))


def cache_hit_usable(store: Store, key: str, items: Iterable[Any] | dict[str, Any]) -> bool:
    """Whether a result Prefect's cache holds under ``key`` may be used, item by item: an
    inference must pass the same checks as an indexed one (two cases with the same inputs
    may each have their own record of one fingerprint), a unit must be the very one the unit
    index names (a superseded, or never published, unit is not). ``items`` is read twice
    (a list, or :func:`~evalsnap.records.task_results.record_items`): checked as a whole
    first (:func:`cacheable`), then each against the store, an item at a time both times.
    A scoring result is a handle of its stored outcomes (:func:`keep_outcomes`): their
    object is read a row at a time, twice, and must be intact and present."""
    if isinstance(items, dict):
        try:
            oid = outcomes.handle_oid(items)
        except (ValueError, EvalsnapError):
            return False
        if oid is None or not key.startswith("score-"):
            return False
        items = outcomes.stored_items(store, oid)
    try:
        if not cacheable(key, items):  # (a stored object gone or damaged: EvalsnapError)
            return False
        for o in _outcomes(key, items):
            if isinstance(o, InferenceOutcome):
                if usable_inference(store, o.oid, o.fingerprint) is None:
                    return False
            else:
                hit = find_unit(store, o.unit_fingerprint)
                if isinstance(hit, str) or hit[0] != o.unit_oid:
                    return False
    except (ValidationError, TypeError, ValueError, RecursionError, EvalsnapError):
        return False
    return True
