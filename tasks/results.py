"""Prefect's task cache, kept inert: JSON ids in, JSON ids out, nothing imported or run.

Prefect persists a cached task result as a *result record*: JSON metadata naming a
serializer, and the result as that serializer wrote it; reading one back instantiates
whatever serializer the file names (``pickle`` runs code; Prefect's ``json`` decoder imports
any ``__class__`` a file names). A store anyone can write to must never get that far, so
both of Prefect's extension points are ours:

* :class:`IdsSerializer` (``type: evalsnap-ids``) writes and reads plain JSON data (lists,
  dicts, strings, numbers) and nothing else; a scoring task's rows it writes as the handle
  of the object they are kept in (:mod:`evalsnap.records.outcomes`), never the rows;
* :class:`StoreResults`, the result storage, keeps records in the evalsnap store
  (``v1/prefect/<key>``, with the store's deadlines) and hands Prefect a record only if it
  parses as plain JSON, names our serializer, and holds exactly what the reuse authority
  (:func:`evalsnap.pipeline.reuse.cache_hit_usable`) would hand out itself; anything else
  reads as absent, so the task runs. It writes only what
  :func:`evalsnap.pipeline.reuse.cacheable` allows: a handle only under the key its rows
  were kept for, in this process (:func:`evalsnap.pipeline.reuse.keep_outcomes`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, ClassVar

from prefect.filesystems import WritableFileSystem
from prefect.serializers import Serializer
from pydantic import Field

from evalsnap.errors import EvalsnapError
from evalsnap.pipeline import context, reuse
from evalsnap.records import outcomes
from evalsnap.records.task_results import SERIALIZER_TYPE, loads_plain, plain, record_result
from evalsnap.rows import Rows
from storage import TooLarge

logger = logging.getLogger(__name__)


class IdsSerializer(Serializer):  # type: ignore[type-arg]
    """Plain JSON data, never code: what evalsnap's tasks return (lists of id records)."""

    type: str = Field(default=SERIALIZER_TYPE, frozen=True)

    def dumps(self, obj: Any) -> bytes:
        if isinstance(obj, Rows):  # a scoring task's outcomes: the handle of their object
            # (evalsnap.records.outcomes), never the rows: Prefect copies what this returns
            # ~3 times as it persists it (a row per case: ~29 MB at 30,000 cases)
            obj = obj.kept if obj.kept is not None else outcomes.handle(None, len(obj))
        if not plain(obj):
            raise ValueError("evalsnap task results are plain JSON data (ids), "
                             f"not {type(obj).__name__}")
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()

    def loads(self, blob: bytes) -> Any:
        return loads_plain(blob)


class StoreResults(WritableFileSystem):
    """Prefect result storage in the evalsnap store, guarded by the reuse authority."""

    _block_type_name: ClassVar[str] = "evalsnap task results"
    _block_type_slug: ClassVar[str] = "evalsnap-task-results"

    store_url: str

    def _usable(self, key: str, data: bytes) -> bool:
        # verdicts per (key, sha256 of the bytes), the run's: Prefect reads a hit twice
        # (exists, read)
        ctx = context.of(self.store_url)
        memo = (key, hashlib.sha256(data).hexdigest())
        known = ctx.verdicts.get(memo)
        if known is not None:
            return known
        try:
            ok = reuse.cache_hit_usable(ctx.store, key, record_result(data))
            if not ok:
                logger.info("cached result %s does not match the store's indexes; "
                            "running the task again", key)
        except (ValueError, RecursionError, EvalsnapError) as exc:
            logger.warning("refusing cached result %s: %s", key, exc)
            ok = False
        ctx.verdicts.put(memo, ok)
        return ok

    # Sync on purpose: Prefect calls block methods sync (``_sync=True``) or awaits what they
    # return only if it is awaitable (prefect._internal.compatibility.blocks).
    def read_path(self, path: str, **_: Any) -> bytes:  # type: ignore[override]
        try:
            data = context.of(self.store_url).store.get_task_result(path)
        except TooLarge as exc:  # planted or damaged: counts as absent, the task runs
            logger.warning("refusing cached result %s: %s", path, exc)
            data = None
        if data is None or not self._usable(path, data):
            raise FileNotFoundError(path)  # Prefect: no cached result, the task runs
        return data

    def write_path(self, path: str, content: bytes, **_: Any) -> str:  # type: ignore[override]
        ctx = context.of(self.store_url)
        try:
            result = record_result(content)  # items parsed as they are checked, never at once
            if isinstance(result, dict):  # a scoring result: the handle of its outcomes
                oid = outcomes.handle_oid(result)
                ok = oid is not None and ctx.kept_outcomes.get(oid) == path
            else:
                ok = reuse.cacheable(path, result)
        except (ValueError, EvalsnapError) as exc:
            logger.warning("not caching task result %s: %s", path, exc)
            return path
        if ok:
            ctx.store.put_task_result(path, content)
        return path
