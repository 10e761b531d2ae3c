"""Deterministic answers to ADK 2.13.0's judge prompts, for the offline judge model.

The judge recognises a prompt by phrases of ADK's own templates, pulls the data ADK
rendered into it (always from the *last* occurrence of each block: the rubric template
carries a worked example with the same tags before the real data) and answers in the
format ADK's parser expects. Rules, all on normalised words (lower-case, split on anything
that is not a letter or digit, a final "s" dropped from words of 4+ letters, stop words
removed):

* ``final_response_match_v2``: *valid* when every key word of the reference response
  occurs in the agent response (a reference without key words: valid when the response is
  non-empty). Answer: ``{"reasoning": ..., "is_the_agent_response_valid": "valid"|"invalid"}``.
* rubric metrics (``rubric_based_final_response_quality_v1``,
  ``rubric_based_tool_use_quality_v1``): per ``[id: X]`` property, *yes* when every quoted
  phrase ('…' or "…") of the property occurs (case-insensitive) in the evidence — the
  ``<final_answer>`` block for final-response quality, the ``<response>`` block (tool calls
  and results as JSON) for tool use — otherwise *no*; a property with no quoted phrase is
  *yes* (not checkable, which ADK's template defines as "not applicable"). Answer: one
  ``ID:/Property:/Evidence:/Rationale:/Verdict:`` block per property.
* ``hallucinations_v1`` segmenter: one ``<sentence>`` per sentence (split at line breaks
  and after ``.``, ``!`` or ``?`` followed by a space).
* ``hallucinations_v1`` validator: per sentence, ``not_applicable`` when it is a question
  or starts with a courtesy word (sorry, hello, thanks…) or has no key words;
  ``supported`` when all its key words occur in the context; else ``unsupported``.

Anything else gets :data:`UNRECOGNISED_ANSWER`, which no ADK judge parser accepts.
"""

from __future__ import annotations

import json
import re

__all__ = [
    "GARBLED_ANSWER",
    "UNRECOGNISED_ANSWER",
    "answer_prompt",
    "classify_prompt",
    "key_words",
]

# Neither text contains a field name any ADK parser looks for (is_the_agent_response_valid,
# Property:, Verdict:, <sentence>, label:), so every judge metric reports "not evaluated".
UNRECOGNISED_ANSWER = "OFFLINE-JUDGE: this prompt is not one of the judge formats I know."
GARBLED_ANSWER = "OFFLINE-JUDGE: garbled on purpose (EVALSNAP_DEMO_JUDGE_GARBLE=1)."

_STOP_WORDS = frozenset(
    "a an and are as at be by can for from has have here i in is it it's its me my now of"
    " on or our that the their there this to was we will with you your".split()
)
_COURTESY_RE = re.compile(r"(sorry|hello|hi|hey|thanks?|you're welcome|welcome)\b")


def _words(text: str) -> list[str]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return [
        w[:-1] if len(w) >= 4 and w.endswith("s") and not w.endswith("ss") else w for w in words
    ]


def key_words(text: str) -> list[str]:
    """Normalised words of ``text`` without stop words, in order, de-duplicated."""
    return list(dict.fromkeys(w for w in _words(text) if w not in _STOP_WORDS))


def _between_last(text: str, start: str, end: str) -> str | None:
    """Text between the last ``start`` and the first ``end`` after it."""
    i = text.rfind(start)
    if i < 0:
        return None
    j = text.find(end, i + len(start))
    return None if j < 0 else text[i + len(start) : j]


def classify_prompt(prompt: str) -> str | None:
    """Which ADK judge template rendered ``prompt`` (None: none we know)."""
    if '"is_the_agent_response_valid"' in prompt and '"Reference response": ' in prompt:
        return "final_response_match_v2"
    if "<properties>" in prompt and "<final_answer>" in prompt:
        return "rubric_based_final_response_quality_v1"
    if "<properties>" in prompt and "<available_tools>" in prompt:
        return "rubric_based_tool_use_quality_v1"
    if "**Context Begin**" in prompt and "**Sentences Begin**" in prompt:
        return "hallucinations_v1_validator"
    if "**Response Begin**" in prompt and "segment" in prompt:
        return "hallucinations_v1_segmenter"
    return None


def _final_response_match_v2(prompt: str) -> str:
    # The template inserts the texts raw (not JSON-quoted) between fixed separators, so
    # the separators, searched from the end, are the only reliable anchors.
    end = prompt.rfind(",\n}\n\nThe answer should be a json alone")
    ref_at = prompt.rfind(',\n  "Reference response": ', 0, end)
    resp_at = prompt.rfind(',\n  "Agent response": ', 0, ref_at)
    if min(end, ref_at, resp_at) < 0:
        return UNRECOGNISED_ANSWER
    response = prompt[resp_at + len(',\n  "Agent response": ') : ref_at]
    reference = prompt[ref_at + len(',\n  "Reference response": ') : end]
    wanted = key_words(reference)
    have = set(_words(response))
    missing = [w for w in wanted if w not in have]
    if not wanted:
        valid = bool(response.strip())
        reasoning = "The reference has no key words; the response is " + (
            "non-empty." if valid else "empty."
        )
    else:
        valid = not missing
        reasoning = (
            f"All key words of the reference occur in the response: {', '.join(wanted)}."
            if valid
            else f"Key words of the reference missing from the response: {', '.join(missing)}."
        )
    answer = {
        "reasoning": reasoning,
        "is_the_agent_response_valid": "valid" if valid else "invalid",
    }
    return json.dumps(answer, indent=2, ensure_ascii=False)


def _quoted(text: str) -> list[str]:
    # Single quotes only count when not inside a word, so "Smith's" is no quote.
    singles = re.findall(r"(?<![\w])'([^']+)'(?![\w])", text)
    return [q for q in re.findall(r'"([^"]+)"', text) + singles if q.strip()]


def _one_line(text: str) -> str:
    # ADK's parser reads Property/Rationale/Verdict line by line: keep each field on one.
    return " ".join(text.split())


def _rubric_answer(prompt: str, kind: str) -> str:
    properties = _between_last(prompt, "<properties>", "</properties>")
    if kind == "rubric_based_final_response_quality_v1":
        evidence, where = _between_last(prompt, "<final_answer>", "</final_answer>"), "final answer"
    else:
        evidence, where = _between_last(prompt, "<response>", "</response>"), "tool calls"
    if properties is None or evidence is None:
        return UNRECOGNISED_ANSWER
    rubrics = re.findall(r"(?m)^\*\s+\[id: ([^\]]*)\]\s?(.*)$", properties)
    if not rubrics:
        return UNRECOGNISED_ANSWER
    blocks = []
    haystack = evidence.lower()
    for rubric_id, text in rubrics:
        phrases = _quoted(text)
        missing = [p for p in phrases if p.lower() not in haystack]
        if not phrases:
            verdict, why = "yes", "The property names no quoted phrase to check; not applicable."
        elif missing:
            verdict, why = "no", f"Not found in the {where}: " + ", ".join(map(repr, missing)) + "."
        else:
            verdict, why = "yes", f"Found in the {where}: " + ", ".join(map(repr, phrases)) + "."
        blocks.append(
            f"ID: {rubric_id.strip()}\nProperty: {_one_line(text)}\n"
            f"Evidence: The {where} as rendered in the prompt.\n"
            f"Rationale: {_one_line(why)}\nVerdict: {verdict}"
        )
    return "\n\n".join(blocks)


def _segment(prompt: str) -> str:
    response = _between_last(prompt, "**Response Begin**\n", "\n**Response End**")
    if response is None:
        return UNRECOGNISED_ANSWER
    sentences = [
        s.strip()
        for line in response.splitlines()
        for s in re.split(r"(?<=[.!?])\s+", line)
        if s.strip()
    ]
    return "\n".join(f"<sentence>{s}</sentence>" for s in sentences)


def _label(sentence: str, context_words: set[str]) -> tuple[str, str]:
    lowered = sentence.lower().strip()
    words = key_words(sentence)
    if lowered.endswith("?") or _COURTESY_RE.match(lowered) or not words:
        return "not_applicable", "A question, courtesy or statement without facts."
    missing = [w for w in words if w not in context_words]
    if not missing:
        return "supported", "Every key word occurs in the context."
    return "unsupported", "Not in the context: " + ", ".join(missing) + "."


def _validate(prompt: str) -> str:
    context = _between_last(prompt, "**Context Begin**\n", "\n**Context End**")
    sentences_block = _between_last(prompt, "**Sentences Begin**\n", "\n**Sentences End**")
    if context is None or sentences_block is None:
        return UNRECOGNISED_ANSWER
    context_words = set(_words(context))
    blocks = []
    for sentence in re.findall(r"<sentence>(.*?)</sentence>", sentences_block, re.DOTALL):
        label, rationale = _label(sentence, context_words)
        excerpt = (
            "The tool outputs and user prompt in the context." if label == "supported" else "null"
        )
        blocks.append(
            f"sentence: {_one_line(sentence)}\nlabel: {label}\nrationale: {rationale}\n"
            f"supporting_excerpt: {excerpt}\ncontradicting_excerpt: null"
        )
    return "\n\n".join(blocks) if blocks else UNRECOGNISED_ANSWER


def answer_prompt(prompt: str) -> tuple[str | None, str]:
    """(template kind or None, answer text) for one rendered judge prompt."""
    kind = classify_prompt(prompt)
    if kind == "final_response_match_v2":
        return kind, _final_response_match_v2(prompt)
    if kind in ("rubric_based_final_response_quality_v1", "rubric_based_tool_use_quality_v1"):
        return kind, _rubric_answer(prompt, kind)
    if kind == "hallucinations_v1_segmenter":
        return kind, _segment(prompt)
    if kind == "hallucinations_v1_validator":
        return kind, _validate(prompt)
    return None, UNRECOGNISED_ANSWER
