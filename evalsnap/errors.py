"""Typed, actionable errors: the one error tree of evalsnap and its store.

Every error evalsnap raises on purpose derives from :class:`EvalsnapError` and carries the
process exit code the command line uses for it (``exit_code``): the CLI catches
``EvalsnapError`` alone, prints the message and exits with that code. Messages say what to
do next, not only what failed. The whole tree (``module`` is given where it is not this
one; ``storage.errors`` names are also importable from ``storage``)::

    class                        module                exit raised when
    EvalsnapError                                      2    (base; bad usage, config or input)
    ├── UsageError                                     2    a flag or argument combination that cannot work
    ├── InputFileError                                 2    a missing or unreadable file / directory
    ├── EvalSetError                                   2    an eval set that is not valid ADK JSON, duplicate ids…
    ├── ConfigError                                    2    test_config.json problems, unknown metric, bad criterion
    │   └── MetricImportError                          2    a custom metric or plugin that cannot be imported
    ├── AgentLoadError                                 2    no agent (app, root_agent, get_agent_async) or --agent-name
    ├── NotFoundError                                  2    an unknown run, snapshot or record id
    ├── UnsupportedSchemaVersion                       2    a record of a newer evalsnap (.kind .found .supported)
    ├── CorruptRecordError                             2    stored bytes hash right but are not the record expected
    ├── ReplayMismatchError                            2    replay asked what the unit's ledger does not hold
    ├── ReplayUnavailableError                         2    no complete judge trace to replay from
    └── StorageError             storage.errors        2    (base of everything :mod:`storage` raises)
        ├── CorruptObjectError   storage.errors        2    bytes do not hash to their name (.url .expected .actual)
        │   └── TooLarge         storage.errors        2    a stored file longer than evalsnap writes (.url .limit)
        ├── ObjectNotFound       storage.errors        2    a content-addressed object is missing (.url)
        ├── StoreUnavailable     storage.errors        2    unknown protocol, missing bucket, bad credentials,
        │                                                   unreachable endpoint, local I/O failure (.url .reason)
        └── InvalidId            storage.errors        2    an id, kind or oid fails validation (.value .what .reason)

    internal control flow: plain ``Exception``, always caught before a user sees it
    LedgerMismatch               evalsnap.pipeline.judge   replay met a request its ledger lacks (→ ReplayMismatchError)
    RecordedJudgeError           evalsnap.pipeline.judge   replay of a judge sample that failed when recorded
    _UnusableParent              evalsnap.pipeline.publish the previous record is unreadable: no parent pointer
    InferenceFailed              tasks.inference           makes Prefect retry (and not cache) a failed batch
    DeadlineExceeded             evalsnap.deadlines        past a deadline: a failed inference, a NOT_EVALUATED unit
    UnsupportedCase              evalsnap.langgraph.inference  a case the lane cannot map: a failed inference
    ToolEscape                   evalsnap.adk._user_code   an agent's SystemExit, KeyboardInterrupt: a failed inference
    RefusedCase                  evalsnap.adk.inference    a case ADK refuses to run: a failed inference
    _Oversize                    storage._backend          a local file over a read's limit (→ TooLarge)

Exit codes of the command line (decided in :mod:`evalsnap.exitcodes`, listed in
docs/exit-codes.md): 0 passed, 1 quality (a metric failed), 2 any error of this tree,
3 incomplete (something could not be evaluated), 4 an internal error (any other exception:
a bug), 128 + N stopped by signal N.

``CorruptObjectError`` and ``CorruptRecordError`` stay two sibling classes, neither one nor
parent and child. ``CorruptObjectError`` is storage integrity: the bytes no longer hash to
the id they are stored under (or a manifest's checksum fails); it carries ``url``,
``expected`` and ``actual``, and the fix is to delete the object and recompute it. The store
finds it on every read, knowing nothing of records. ``CorruptRecordError`` is the layer
above: the bytes are intact (the hash is right) but do not parse as the record expected,
e.g. written by a buggy evalsnap; there is no expected/actual hash to carry, and only
:mod:`evalsnap.records` can tell. One class would put record schemas into ``storage``; a
child of ``CorruptObjectError`` would carry hash attributes it cannot fill (and break its
``__reduce__``), and would change every ``except CorruptObjectError`` that recomputes a
damaged object (``--reuse``) into one that silently skips schema bugs too. Code that treats
both alike names both: ``except (CorruptObjectError, CorruptRecordError)``.

Lower-level errors are mapped once, where they arise: fsspec / botocore / aiohttp / gcsfs /
``OSError`` from a store in :mod:`storage._backend` (``Backend.failures``), pydantic and
JSON errors of ADK's ``EvalSet`` in :mod:`evalsnap.adk.evalset`, of ``EvalConfig`` and
criteria (and ADK's ``LLMRegistry`` "Model … not found", raised when a judge evaluator is
built) in :mod:`evalsnap.adk.config`, stored records in :mod:`evalsnap.records._base`.

This module imports nothing but :mod:`typing`, so :mod:`storage` can derive from it and stay light.
"""

from __future__ import annotations

from typing import Any, ClassVar


class EvalsnapError(Exception):
    """Base class; ``exit_code`` is what ``evalsnap`` exits with."""

    exit_code: ClassVar[int] = 2


class UsageError(EvalsnapError):
    """The command was called in a way that cannot work."""


class InputFileError(EvalsnapError):
    """A file or directory named on the command line is missing or unreadable."""


class EvalSetError(EvalsnapError):
    """An eval set file is not a valid ADK eval set."""


class ConfigError(EvalsnapError):
    """A ``test_config.json`` is invalid, or names a metric nobody provides."""


class MetricImportError(ConfigError):
    """A custom metric's ``codeConfig.name`` or a plugin module cannot be imported."""


class AgentLoadError(EvalsnapError):
    """The agent directory does not expose an ADK agent (``app``, ``root_agent`` or
    ``get_agent_async``), its import fails, or ``--agent-name`` names no agent of its tree."""


class NotFoundError(EvalsnapError):
    """A run, snapshot or record id that the store does not hold."""


class UnsupportedSchemaVersion(EvalsnapError):
    """A stored object was written by a newer schema version than this evalsnap reads."""

    def __init__(self, kind: str, found: int, supported: int) -> None:
        super().__init__(
            f"{kind} has schema_version {found}, but this evalsnap reads up to {supported}; "
            "upgrade evalsnap (pip install -U evalsnap) to read it."
        )
        self.kind = kind
        self.found = found
        self.supported = supported

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, self.found, self.supported))


class CorruptRecordError(EvalsnapError):
    """Stored bytes hash correctly but do not parse as the expected record."""


class ReplayMismatchError(EvalsnapError):
    """A judge request made during replay is not in the unit's ledger."""


class ReplayUnavailableError(EvalsnapError):
    """A judge unit has no complete trace to replay from."""
