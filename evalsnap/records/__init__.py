"""Versioned records written to the store (one module per record)."""

from evalsnap.records._base import CorruptRecordError, StoredModel
from evalsnap.records.inference import InferenceRecord
from evalsnap.records.judge import LedgerEntry
from evalsnap.records.record import (
    EvaluationRecord,
    InferenceRef,
    ManifestEntry,
    RunManifest,
    RunSummary,
    UnitRef,
)
from evalsnap.records.snapshot import EvaluatorIdentity, FrozenCase, MetricRule, Snapshot
from evalsnap.records.unit import ScoreUnit, UnitRow, UnitVerdict

__all__ = [
    "CorruptRecordError",
    "EvaluationRecord",
    "EvaluatorIdentity",
    "FrozenCase",
    "InferenceRecord",
    "InferenceRef",
    "LedgerEntry",
    "ManifestEntry",
    "MetricRule",
    "RunManifest",
    "RunSummary",
    "ScoreUnit",
    "UnitVerdict",
    "Snapshot",
    "StoredModel",
    "UnitRef",
    "UnitRow",
]
