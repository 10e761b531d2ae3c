"""test_config.json → resolved scoring rules and a metric registry.

The file is ADK's ``EvalConfig`` (camelCase). evalsnap reads two optional
extensions that ADK ignores: ``customMetrics.<name>.version`` (a trusted
implementation version; without it a custom metric is never reused) and the
top-level ``evalsnapPlugins`` / ``metricVersions`` keys, and ``evalsnapPrices`` (model
prices for the estimated cost of a run; not a scoring rule, so no fingerprint reads it), and
``evalsnapTimeouts`` (a unit's deadline by metric; also not a rule), and
``evalsnapIdentity`` (what the agent reads from outside its package: part of the agent's
identity, :mod:`evalsnap.agents.identity`, not of any rule).
"""

from __future__ import annotations

import difflib
import inspect
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.adk.evaluation.custom_metric_evaluator import (
    _CustomMetricEvaluator,
    _get_metric_function,
)
from google.adk.evaluation.eval_config import EvalConfig
from google.adk.evaluation.eval_metrics import BaseCriterion, EvalMetric
from google.adk.evaluation.metric_evaluator_registry import (
    DEFAULT_METRIC_EVALUATOR_REGISTRY,
    MetricEvaluatorRegistry,
    register_custom_metrics_from_config,
)
from google.adk.version import __version__ as ADK_VERSION
from pydantic import ValidationError

import evalsnap.adk.context  # noqa: F401  (installs the EvaluationContext shim first)
from evalsnap.adk import plugins
from evalsnap.adk.prices import read_prices
from evalsnap.agents import identity
from evalsnap.deadlines import read_metric_timeouts
from evalsnap.errors import ConfigError, InputFileError, MetricImportError
from evalsnap.fingerprint import fingerprint
from evalsnap.jsonsafe import strict_json
from evalsnap.records import EvaluatorIdentity, MetricRule
from evalsnap.records.record import ModelPrice

_EXTENSION_KEYS = ("evalsnapPlugins", "metricVersions", "evalsnapPrices", "evalsnapTimeouts",
                   identity.CONFIG_KEY)


@dataclass
class LoadedConfig:
    """A validated config: ADK's model, evalsnap's rules, and a private registry."""

    raw: dict[str, Any]
    eval_config: EvalConfig
    rules: list[MetricRule]
    registry: MetricEvaluatorRegistry
    custom_paths: dict[str, str] = field(default_factory=dict)
    where: str = "<config>"
    live_criteria: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Criteria as configured, transport settings (``httpOptions``) included; never stored."""
    prices: dict[str, ModelPrice] | None = None
    """``evalsnapPrices``: price per million tokens by model name; None without a table."""
    timeouts: dict[str, float] = field(default_factory=dict)
    """``evalsnapTimeouts``: a unit's deadline by metric name (:mod:`evalsnap.deadlines`)."""
    identity_inputs: identity.DeclaredInputs | None = None
    """``evalsnapIdentity``: environment variables and files the agent's identity adds."""

    def eval_metric(self, rule: MetricRule) -> EvalMetric:
        """The EvalMetric to score with: the live criterion, so a judge keeps its transport."""
        live = self.live_criteria.get(rule.metric_name)
        if live is not None:
            rule = rule.model_copy(update={"criterion": live})
        return eval_metric_for(rule, self.custom_paths.get(rule.metric_name))


#: Transport settings can carry credentials (headers, API keys); they are not part of what
#: a judge is asked, so they are never stored or fingerprinted.
_TRANSPORT_KEYS = frozenset({"httpOptions", "http_options"})


def without_transport(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_transport(v) for k, v in value.items() if k not in _TRANSPORT_KEYS}
    if isinstance(value, list):
        return [without_transport(v) for v in value]
    return value


def eval_metric_for(rule: MetricRule, custom_path: str | None) -> EvalMetric:
    """Builds ADK's EvalMetric for a rule, as ADK's own config reader does."""
    criterion = BaseCriterion.model_validate(rule.criterion)
    metric = EvalMetric(
        metric_name=rule.metric_name,
        threshold=rule.threshold,
        criterion=criterion,
        custom_function_path=custom_path,
    )
    metric._config_custom_function_path = custom_path  # noqa: SLF001 (ADK's own route)
    return metric


def read_config_file(path: str | Path | None) -> tuple[dict[str, Any], str]:
    """Reads the JSON; a missing path means ADK's default criteria."""
    if path is None:
        return {"criteria": {"tool_trajectory_avg_score": 1.0, "response_match_score": 0.8}}, (
            "<default criteria>"
        )
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"config {p} does not exist; pass --config test_config.json.")
    try:
        raw = strict_json(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError included
        raise ConfigError(f"config {p} is not valid JSON: {exc}; fix the file.") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"config {p} must be a JSON object with `criteria`.")
    return raw, str(p)


def _split_extensions(raw: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Removes evalsnap-only keys so ADK's parser sees an ADK config."""
    adk = {k: v for k, v in raw.items() if k not in _EXTENSION_KEYS}
    versions: dict[str, str] = {}
    declared = raw.get("metricVersions", {}) or {}
    if not isinstance(declared, dict):
        raise ConfigError(f"{where}: `metricVersions` must map metric names to version strings.")
    versions.update({str(k): _version(v, f"metricVersions.{k}", where)
                     for k, v in declared.items()})
    customs = adk.get("customMetrics", adk.get("custom_metrics"))
    if customs is not None and not isinstance(customs, dict):
        raise ConfigError(f"{where}: `customMetrics` must be an object keyed by metric name.")
    if customs:
        cleaned = {}
        for name, entry in customs.items():
            if not isinstance(entry, dict):
                raise ConfigError(
                    f"{where}: customMetrics.{name} must be an object with codeConfig.name."
                )
            entry = dict(entry)
            if "version" in entry:
                versions[name] = _version(entry.pop("version"), f"customMetrics.{name}.version",
                                          where)
            cleaned[name] = entry
        adk["customMetrics" if "customMetrics" in adk else "custom_metrics"] = cleaned
    return adk, versions


def _version(value: Any, key: str, where: str) -> str:
    """A declared implementation version: a non-empty string (a number is accepted)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float) or not str(value):
        raise ConfigError(f"{where}: `{key}` must be a non-empty version string such as \"1\"; "
                          "remove it to have the metric scored again on every run.")
    return str(value)


def _validation_message(exc: ValidationError, where: str) -> str:
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ())]
    at = ".".join(loc)
    if loc and loc[0] in ("customMetrics", "custom_metrics"):
        name = loc[1] if len(loc) > 1 else "?"
        return (f"{where}: customMetrics.{name} is malformed: {err.get('msg')} at `{at}`. "
                "Each entry needs codeConfig.name, the import path of the function "
                "(e.g. my_agent.metrics.my_fn); metricInfo and description are optional. "
                "The metric must be named in both `criteria` and `customMetrics`.")
    return (f"{where} is not a valid ADK test_config: {err.get('msg')} at `{at}`. "
            "A criterion is a number (the threshold) or an object with `threshold`.")


def _template_hash(evaluator_type: type) -> str | None:
    module = sys.modules.get(evaluator_type.__module__)
    prompts = sorted(
        (name, value)
        for name, value in vars(module).items()
        if "PROMPT" in name.upper() and isinstance(value, str)
    ) if module else []
    return fingerprint("prompt", prompts) if prompts else None


def _identity(name: str, evaluator_type: type, custom_path: str | None, version: str | None,
              judge: bool) -> EvaluatorIdentity:
    if custom_path is not None:
        return EvaluatorIdentity(kind="custom_function", name=custom_path, version=version)
    qualname = f"{evaluator_type.__module__}.{evaluator_type.__qualname__}"
    if evaluator_type.__module__.startswith("google.adk."):
        return EvaluatorIdentity(
            kind="builtin", name=qualname, adk_version=ADK_VERSION,
            template_hash=_template_hash(evaluator_type) if judge else None,
        )
    version = version or getattr(evaluator_type, "version", None)
    return EvaluatorIdentity(kind="custom_class", name=qualname, version=version,
                             template_hash=_template_hash(evaluator_type) if judge else None)


def load_config(path: str | Path | None) -> LoadedConfig:
    raw, where = read_config_file(path)
    return resolve_config(raw, where=where)


def resolve_config(raw: dict[str, Any], *, where: str = "<config>") -> LoadedConfig:
    """Validates a config, imports its metrics, and resolves every rule.

    Everything that can be wrong with a config is found here, before any agent call.
    """
    plugins.load_entry_point_plugins()
    modules = raw.get("evalsnapPlugins", []) or []
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise ConfigError(f"{where}: `evalsnapPlugins` must be a list of module paths.")
    try:
        plugins.load_module_plugins(modules)
    except MetricImportError as exc:
        raise MetricImportError(f"{where}: {exc}") from exc.__cause__
    adk_raw, versions = _split_extensions(raw, where)
    prices = read_prices(raw, where)
    declared = identity.read_declared(raw, where)
    try:
        eval_config = EvalConfig.model_validate(adk_raw)
    except ValidationError as exc:
        raise ConfigError(_validation_message(exc, where)) from exc
    if not eval_config.criteria:
        raise ConfigError(f"{where} names no metric under `criteria`; add at least one.")
    registry = register_custom_metrics_from_config(
        eval_config, DEFAULT_METRIC_EVALUATOR_REGISTRY.fork()
    )
    custom_paths = {
        name: cfg.code_config.name for name, cfg in (eval_config.custom_metrics or {}).items()
    }
    infos = {info.metric_name: info for info in registry.get_registered_metrics()}
    resolved = [
        _resolve_rule(name, criterion, registry, infos, custom_paths, versions, where)
        for name, criterion in eval_config.criteria.items()
    ]
    rules = [rule for rule, _ in resolved]
    timeouts = read_metric_timeouts(raw, where, list(eval_config.criteria))
    if declared is not None:
        identity.declare(declared)
    return LoadedConfig(raw=raw, eval_config=eval_config, rules=rules, registry=registry,
                        prices=prices, timeouts=timeouts, identity_inputs=declared,
                        live_criteria={rule.metric_name: full for rule, full in resolved},
                        custom_paths={k: v for k, v in custom_paths.items()
                                      if k in eval_config.criteria}, where=where)


def _check_range(name: str, threshold: float, info: Any, where: str) -> None:
    """A threshold outside the metric's range (ADK's metric info) would always pass or never."""
    interval = getattr(getattr(info, "metric_value_info", None), "interval", None)
    if interval is None or not math.isfinite(threshold):
        return
    low = -math.inf if interval.min_value is None else float(interval.min_value)
    high = math.inf if interval.max_value is None else float(interval.max_value)
    if not low <= threshold <= high:
        raise ConfigError(
            f"{where}: the threshold of {name!r} is {threshold:g}, outside the metric's range "
            f"{'(' if interval.open_at_min else '['}{low:g}, {high:g}"
            f"{')' if interval.open_at_max else ']'} (ADK's metric info): it would "
            f"{'always pass' if threshold < low else 'never pass'}. Use a threshold within "
            "the range (for a custom metric, `metricInfo` sets it).")


def _finite(value: Any) -> bool:
    """No NaN or infinity anywhere in ``value`` (JSON data)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _takes_four_positional(fn: Any) -> bool:
    try:
        inspect.signature(fn).bind(None, None, None, None)
    except TypeError:
        return False
    except ValueError:  # no signature (some builtins): let the call decide
        return True
    return True


def unregistered_judge_model(criterion: dict[str, Any]) -> str | None:
    """The judge model a criterion names, if ADK's ``LLMRegistry`` cannot resolve it."""
    options = criterion.get("judgeModelOptions", criterion.get("judge_model_options"))
    model = options.get("judgeModel", options.get("judge_model")) \
        if isinstance(options, dict) else None
    if not isinstance(model, str) or not model:
        return None
    from google.adk.models.registry import LLMRegistry

    try:
        LLMRegistry.resolve(model)
    except ValueError:
        return model
    except Exception:  # a registered model whose module fails: not "unregistered"
        return None
    return None


def _unregistered_judge_message(name: str, model: str, where: str) -> str:
    message = (
        f"{where}: metric {name!r}: judge model {model!r} is not registered with ADK's "
        "LLMRegistry in this process (model not found). Register it in the agent package "
        "(as under `adk eval`: `run` imports it first; give `rescore` and `replay` "
        "`--agent AGENT_DIR`), from a module named in the config's `evalsnapPlugins` "
        "(imported from the agent's parent directory, e.g. \"evalsnapPlugins\": "
        "[\"my_agent.models\"]) or from an installed `evalsnap.plugins` entry point; "
        "installing evalsnap registers no judge model."
    )
    if "snapshot" in where:
        message += (" The rules of a snapshot name no plugins (a stored record never imports "
                    "code): pass --config with the test_config.json whose evalsnapPlugins "
                    "registers the judge model.")
    return message


def _resolve_rule(name: str, criterion: Any, registry: MetricEvaluatorRegistry,
                  infos: dict[str, Any], custom_paths: dict[str, str],
                  versions: dict[str, str], where: str) -> tuple[MetricRule, dict[str, Any]]:
    if name not in infos:
        known = ", ".join(sorted(infos))
        near = difflib.get_close_matches(name, list(custom_paths) + list(infos), n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise ConfigError(
            f"{where}: metric {name!r} is not known (metric is not found).{hint} Known metrics: "
            f"{known}. For a custom metric, name it under both `criteria` and `customMetrics` "
            "with codeConfig.name; for an Evaluator subclass, register it from a module named "
            "in `evalsnapPlugins` or an `evalsnap.plugins` entry point."
        )
    evaluator_type = registry._registry[name][0]  # noqa: SLF001
    custom_path = custom_paths.get(name)
    if issubclass(evaluator_type, _CustomMetricEvaluator):
        if custom_path is None:
            raise ConfigError(f"{where}: custom metric {name!r} has no codeConfig.name.")
        try:
            fn = _get_metric_function(custom_path)
        except (ImportError, TypeError) as exc:  # TypeError: the path names a non-callable
            cause = exc.__cause__ or exc
            raise MetricImportError(
                f"{where}: custom metric {name!r}: cannot import {custom_path!r} ({cause}). "
                "Function cannot import: the path must match the module file and function "
                "names, importable from the agent's parent directory (e.g. "
                "my_agent.metrics.my_fn)."
            ) from exc
        if not _takes_four_positional(fn):
            raise ConfigError(
                f"{where}: custom metric {name!r} ({custom_path}) must accept four positional "
                "arguments (metric, actual, expected, scenario)."
            )
    base = criterion if isinstance(criterion, BaseCriterion) else BaseCriterion(threshold=criterion)
    try:
        resolved = evaluator_type.criterion_type.model_validate(base.model_dump())
    except ValidationError as exc:
        raise ConfigError(
            f"{where}: criterion of {name!r} is not a valid "
            f"{evaluator_type.criterion_type.__name__}: {exc.errors()[0].get('msg')}."
        ) from exc
    resolved_data = resolved.model_dump(mode="json", by_alias=True)
    if not _finite(resolved_data) or not _finite(base.model_extra or {}):
        # pydantic reads "Infinity"/"nan" strings as floats; a rule must be storable JSON
        raise ConfigError(f"{where}: criterion of {name!r} holds a NaN or infinite number; "
                          "use a finite threshold such as 0.8.")
    _check_range(name, float(resolved.threshold), infos[name], where)
    fields = evaluator_type.criterion_type.model_fields
    field_names: set[str] = set(fields) | {f.alias for f in fields.values() if f.alias}
    for key, value in (base.model_extra or {}).items():
        if key not in field_names:  # keep extra keys a custom criterion reads, spelled as given
            resolved_data.setdefault(key, value)
    probe = EvalMetric(metric_name=name, threshold=resolved.threshold,
                       criterion=BaseCriterion.model_validate(resolved_data))
    probe._config_custom_function_path = custom_path  # noqa: SLF001
    try:
        evaluator = registry.get_evaluator(probe)
    except Exception as exc:
        model = unregistered_judge_model(resolved_data)
        if model is not None:
            raise ConfigError(_unregistered_judge_message(name, model, where)) from exc
        raise ConfigError(f"{where}: metric {name!r} cannot be set up: {exc}.") from exc
    judge = hasattr(evaluator, "_judge_model")
    identity = _identity(name, evaluator_type, custom_path, versions.get(name), judge)
    stored = without_transport(resolved_data)
    rule_body = {"metric_name": name, "criterion": stored, "evaluator": identity}
    return MetricRule(
        metric_name=name, threshold=float(resolved.threshold), criterion=stored,
        evaluator=identity, metric_info=infos[name].model_dump(mode="json", by_alias=True),
        judge=judge, rule_fingerprint=fingerprint("rule", rule_body),
    ), resolved_data
