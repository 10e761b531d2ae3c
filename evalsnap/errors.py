"""Typed, actionable errors.

Every error evalsnap raises on purpose derives from :class:`EvalsnapError` and
carries the process exit code the command line uses for it::

    EvalsnapError (exit 2: bad usage, config or input)
    ├── UsageError               a flag or argument combination that cannot work
    ├── InputFileError           a missing or unreadable file / directory
    ├── EvalSetError             an eval set that is not valid ADK JSON, duplicate ids…
    ├── ConfigError              test_config.json problems, unknown metric, bad criterion
    │   └── MetricImportError    a custom metric or plugin that cannot be imported
    ├── AgentLoadError           an agent dir without ``root_agent``
    ├── NotFoundError            an unknown run, snapshot or record id
    └── UnsupportedSchemaVersion a stored object written by a newer evalsnap

Storage problems (``storage.errors``) use the same exit code; the command line
catches both hierarchies. Messages say what to do next, not only what failed.
"""

from __future__ import annotations


class EvalsnapError(Exception):
    """Base class; ``exit_code`` is what ``evalsnap`` exits with."""

    exit_code = 2


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
    """The agent directory does not expose an ADK agent."""


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
