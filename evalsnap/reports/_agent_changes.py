"""What changed in the agent between two records, in words, from the stored identities.

Each inference record keeps the manifest of the agent that produced it
(:attr:`evalsnap.records.InferenceRecord.agent_manifest`); two manifests name what changed
(:func:`evalsnap.agents.identity.changes`): ``place_agent.instruction``, ``.env
TRAVEL_CONCIERGE_SCENARIO``, ``concierge.tools[map_tool] code``. Names only, never values.
"""

from __future__ import annotations

from typing import Any

from evalsnap.agents.identity import changes
from evalsnap.errors import EvalsnapError
from evalsnap.fingerprint import fingerprint
from evalsnap.records import EvaluationRecord, InferenceRef, repo

__all__ = ["INPUTS_CHANGED", "AgentChanges"]

INPUTS_CHANGED = "case inputs changed (user turns, scenario or session input)"


class AgentChanges:
    """Reads inference records once each and compares their agents."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._manifests: dict[str, dict[str, Any] | None] = {}
        self._pairs: dict[tuple[str, str], list[str]] = {}

    def manifest(self, inference_oid: str) -> dict[str, Any] | None:
        if inference_oid not in self._manifests:
            try:
                manifest = repo.get_inference(self.store, inference_oid).agent_manifest
            except EvalsnapError:
                manifest = None
            self._manifests[inference_oid] = manifest
        return self._manifests[inference_oid]

    def between(self, before: InferenceRef, after: InferenceRef) -> list[str]:
        """Why ``after`` has another inference key than ``before``: the agent's changes, or
        that the case's inputs (or repetition, or google-adk version) changed."""
        if before.inference_fingerprint == after.inference_fingerprint:
            return []
        a, b = self.manifest(before.inference_oid), self.manifest(after.inference_oid)
        if a is None or b is None:
            return ["agent identity not recorded (an older record)"]
        key = fingerprint("agent", a), fingerprint("agent", b)
        if key not in self._pairs:
            self._pairs[key] = changes(a, b) if key[0] != key[1] else []
        return self._pairs[key] or [INPUTS_CHANGED]

    def of_records(self, before: EvaluationRecord | None,
                   after: EvaluationRecord) -> tuple[list[dict[str, Any]], list[str]]:
        """Per inference of ``after``: ran or reused, and why its key differs from the one of
        the same case in ``before``; and every agent change found, in order."""
        earlier = {(r.eval_id, r.repetition): r for r in before.inference} if before else {}
        entries, found = [], []
        for ref in after.inference:
            previous = earlier.get((ref.eval_id, ref.repetition))
            why = (self.between(previous, ref) if previous is not None
                   else ["new case"] if before is not None else [])
            entries.append({"eval_id": ref.eval_id, "repetition": ref.repetition,
                            "action": "reused" if ref.reused else "ran", "status": ref.status,
                            "inference_fingerprint": ref.inference_fingerprint,
                            "same_key_as_parent": previous is not None
                            and previous.inference_fingerprint == ref.inference_fingerprint,
                            "changes": why})
            for item in why:
                if item not in found and item not in ("new case", INPUTS_CHANGED):
                    found.append(item)
        return entries, found
