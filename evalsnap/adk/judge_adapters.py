"""Per-evaluator knowledge of ADK's judges: which invocation a call judges, and parsing.

Each adapter attributes a judge request to an actual invocation (and, for
``hallucinations_v1``, to the segmenter or validator step) and runs the evaluator's
*own* parser over a raw answer, so the ledger holds exactly what ADK made of it.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from google.adk.evaluation import final_response_match_v2 as frm2
from google.adk.evaluation import hallucinations_v1 as halluc
from google.adk.evaluation.llm_as_judge import LlmAsJudge
from google.adk.evaluation.rubric_based_evaluator import RubricBasedEvaluator
from google.adk.models.llm_response import LlmResponse
from google.adk.version import __version__ as ADK_VERSION
from google.genai import types


def aggregation_version(evaluator: Any) -> str:
    """``adk-<version>/<class>``; a class may declare ``evalsnap_aggregation_version``."""
    cls = type(evaluator)
    declared = getattr(cls, "evalsnap_aggregation_version", None)
    return str(declared) if declared else f"adk-{ADK_VERSION}/{cls.__qualname__}"


def evaluator_path(evaluator: Any) -> str:
    cls = type(evaluator)
    return f"{cls.__module__}.{cls.__qualname__}"


def _as_response(raw: str) -> LlmResponse:
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(text=raw)]))


class JudgeAdapter:
    """Fallback for an unknown evaluator holding ``_judge_model``: calls are recorded and
    replayable, but neither attributed to invocations nor parsed."""

    known = False

    def __init__(self, evaluator: Any) -> None:
        self.evaluator = evaluator
        self.aggregation_version = aggregation_version(evaluator)
        self.evaluator_path = evaluator_path(evaluator)

    def tag(self, prompt: str, sample_index: int) -> tuple[int | None, str]:
        return None, "judge"

    def parse(self, raw: str, role: str) -> tuple[dict[str, Any] | None, bool]:
        return None, True


class LlmAsJudgeAdapter(JudgeAdapter):
    """``LlmAsJudge`` renders one prompt per invocation, in order, before any call."""

    known = True

    def __init__(self, evaluator: LlmAsJudge) -> None:
        super().__init__(evaluator)
        self._prompts: list[str] = []
        self._samples = max(1, int(evaluator._judge_model_options.num_samples))  # noqa: SLF001
        render = evaluator.format_auto_rater_prompt

        def render_and_remember(actual: Any, expected: Any) -> str:
            prompt = render(actual, expected)
            self._prompts.append(prompt)
            return prompt

        evaluator.format_auto_rater_prompt = render_and_remember  # type: ignore[method-assign]

    def tag(self, prompt: str, sample_index: int) -> tuple[int | None, str]:
        hits = [i for i, p in enumerate(self._prompts) if p == prompt]
        if not hits:
            return None, "judge"
        # Invocations with identical prompts share one request key; samples count on
        # across them, in the order ADK creates them.
        return hits[min(sample_index // self._samples, len(hits) - 1)], "judge"

    def parse(self, raw: str, role: str) -> tuple[dict[str, Any] | None, bool]:
        score = self.evaluator.convert_auto_rater_response_to_score(_as_response(raw))
        parsed: dict[str, Any] = {
            "score": score.score,
            "rubric_scores": [s.model_dump(mode="json") for s in score.rubric_scores or []]
            or None,
        }
        if isinstance(self.evaluator, frm2.FinalResponseMatchV2Evaluator):
            parsed["label"] = frm2._parse_critique(raw).value  # noqa: SLF001
            parsed["rationale"] = _json_field(raw, "reasoning")
        if isinstance(self.evaluator, RubricBasedEvaluator):
            parser = self.evaluator._auto_rater_response_parser  # noqa: SLF001
            parsed["verdicts"] = [r.model_dump(mode="json") for r in parser.parse(raw)]
        return parsed, score.score is not None


class HallucinationsAdapter(JudgeAdapter):
    """``hallucinations_v1`` judges invocations one after another: segmenter, then validator
    per response step; the invocation is the one whose steps were gathered last."""

    known = True

    def __init__(self, evaluator: halluc.HallucinationsV1Evaluator) -> None:
        super().__init__(evaluator)
        self._current = -1
        gather = evaluator._get_steps_to_evaluate  # noqa: SLF001

        def gather_and_count(actual: Any) -> Any:
            self._current += 1
            return gather(actual)

        evaluator._get_steps_to_evaluate = gather_and_count  # type: ignore[method-assign]  # noqa: SLF001

    def tag(self, prompt: str, sample_index: int) -> tuple[int | None, str]:
        index = self._current if self._current >= 0 else None
        for role, template in (("segmenter", self.evaluator.segmenter_prompt),
                               ("validator", self.evaluator.sentence_validator_prompt)):
            head = template.split("{", 1)[0]
            if head and prompt.startswith(head):
                return index, role
        return index, "judge"

    def parse(self, raw: str, role: str) -> tuple[dict[str, Any] | None, bool]:
        if role == "segmenter":
            sentences = halluc._parse_sentences(raw)  # noqa: SLF001
            return {"sentences": sentences}, bool(sentences)
        results = halluc._parse_validation_results(raw)  # noqa: SLF001
        scores = []
        for r in results:
            label = (r.get("label") or "").strip().lower()
            if label in halluc._POSITIVE_LABELS:  # noqa: SLF001
                scores.append(1)
            elif label in halluc._NEGATIVE_LABELS:  # noqa: SLF001
                scores.append(0)
        score = statistics.mean(scores) if scores else None
        return {"results": results, "score": score}, score is not None


def adapter_for(evaluator: Any) -> JudgeAdapter:
    if isinstance(evaluator, LlmAsJudge):
        return LlmAsJudgeAdapter(evaluator)
    if isinstance(evaluator, halluc.HallucinationsV1Evaluator):
        return HallucinationsAdapter(evaluator)
    return JudgeAdapter(evaluator)


def _json_field(raw: str, name: str) -> str | None:
    start, end = raw.find("{"), raw.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        value = json.loads(raw[start:end + 1])
    except json.JSONDecodeError:
        return None
    field = value.get(name) if isinstance(value, dict) else None
    return field if isinstance(field, str) else None
