"""Everything checked before any model call: agent, eval set, config, selection, store."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.adk.evaluation.eval_case import EvalCase
from google.adk.evaluation.eval_set import EvalSet

from evalsnap.adk.config import LoadedConfig, load_config, resolve_config
from evalsnap.adk.evalset import EvalCases, load_eval_cases, load_initial_session
from evalsnap.adk.targets import EvalTarget, default_config_path, resolve_targets
from evalsnap.agents.base import LoadedAgent, ensure_importable
from evalsnap.agents.lanes import load_agent
from evalsnap.errors import ConfigError, InputFileError, NotFoundError, UsageError
from evalsnap.exitcodes import FailOn
from evalsnap.fingerprint import inference_fingerprint, unit_fingerprint
from evalsnap.gates import check_gate
from evalsnap.pipeline import reuse
from evalsnap.pipeline.freeze import FreezeRequest
from evalsnap.pipeline.infer import InferBatch, InferItem, batches, use_agent
from evalsnap.pipeline.outcomes import InferenceOutcome, UnitOutcome
from evalsnap.pipeline.publish import PublishRequest
from evalsnap.pipeline.score import ScoreRequest
from evalsnap.records import EvaluationRecord, Snapshot, marks, repo
from evalsnap.records.record import Baseline, CaseStability, Coverage
from evalsnap.spec import RunOptions, RunSpec

if TYPE_CHECKING:
    from evalsnap.pipeline.context import RunContext
    from evalsnap.rows import Rows

logger = logging.getLogger(__name__)


@dataclass
class Plan:
    """A validated run: what to infer, what to score, where to store it."""

    context: RunContext = field(repr=False, compare=False)
    """The run's collaborators: its store, settings and progress sink."""
    store_url: str
    eval_set: EvalCases
    """The eval set: its header, its cases as rows (let go once frozen), their ids."""
    config: LoadedConfig
    agent: LoadedAgent | None = None
    """The agent an evaluate run infers with (None for a rescore)."""
    agent_dir: str | None = None
    """The agent package every scoring process imports first (``--agent`` for a rescore)."""
    agent_name: str | None = None
    framework: str | None = None
    """``adk`` or ``langgraph`` when forced; None: detected from the package."""
    repetitions: int = 1
    repetition_gate: str = "mean"
    """How repetitions are gated (:mod:`evalsnap.aggregates`); recorded in coverage."""
    until_stable: int | None = None
    """``--until-stable MAX`` (:mod:`evalsnap.pipeline.stability`); None: off."""
    stability: dict[str, CaseStability] | None = None
    """With ``until_stable``, once the run knows: each case's repetitions and why it stopped."""
    metric_names: list[str] = field(default_factory=list)
    case_ids: list[str] = field(default_factory=list)
    sys_paths: list[str] = field(default_factory=list)
    # rescore only
    source: str | None = None
    source_outcomes: list[InferenceOutcome] = field(default_factory=list)
    skipped_cases: list[str] = field(default_factory=list)
    uninferred_cases: list[str] = field(default_factory=list)
    source_note: str | None = None
    """Why a rescore's source does not cover its whole eval set and config, if it does not."""
    baseline: Baseline | None = None
    """The record this run is compared with (``--baseline``)."""
    fail_on: FailOn | None = None
    """The run's gate (``--fail-on``), recorded with it (what makes a run *good*)."""

    def coverage(self) -> Coverage:
        """What of the eval set and config this run covers: a subset is never ``latest``."""
        cases = set(self.case_ids)
        missing_cases = [c for c in self.eval_set.ids if c not in cases]
        missing_metrics = [r.metric_name for r in self.config.rules
                           if r.metric_name not in set(self.metric_names)]
        repetitions = (max((o.repetition for o in self.source_outcomes), default=0) + 1
                       if self.agent is None else self.repetitions)
        return Coverage(full=not (missing_cases or missing_metrics or self.source_note),
                        missing_cases=missing_cases, missing_metrics=missing_metrics,
                        repetitions=repetitions, note=self.source_note,
                        repetition_gate=self.repetition_gate, until_stable=self.until_stable,
                        stability=self.stability)

    def release_cases(self) -> None:
        """Lets go of the eval set's cases once they are frozen: from then on the run reads
        them from its snapshot. Their ids stay for :meth:`coverage`."""
        self.eval_set.release()

    @property
    def config_json(self) -> str:
        return json.dumps(self.config.raw, sort_keys=True)

    def selected_rules(self) -> list[Any]:
        return [r for r in self.config.rules if r.metric_name in set(self.metric_names)]

    @property
    def inference_total(self) -> int:
        """Inferences of an evaluate run (cases × repetitions)."""
        return len(self.case_ids) * self.repetitions

    # ---- the requests of one run, in pipeline order -----------------------------------

    def inference_batches(self, run: RunOptions,
                          more: dict[str, range] | None = None) -> Iterator[InferBatch]:
        """The run's inference, as batches of consecutive cases × repetitions (``more``:
        only these repetitions of these cases, a round of ``--until-stable``), each made
        when it is asked for: the batches of 30,000 cases (each case's JSON in its item)
        were ~50 MB made before the first ran, held until the last had run."""
        assert self.agent is not None, "only an evaluate plan runs inference"
        identity = self.agent.identity
        wanted = more if more is not None else {c: range(self.repetitions) for c in self.case_ids}
        total = sum(len(wanted.get(c, ())) for c in self.eval_set.ids)
        s = self.context.settings
        self.context.progress.expect("inference", total)
        sizes = iter([len(part) for part in batches(total, s.max_workers, s.infer_batch)])

        def items() -> Iterator[InferItem]:
            for case_id, data in zip(self.eval_set.ids, self.eval_set.cases.json_items(),
                                     strict=True):
                reps = wanted.get(case_id, ())
                if reps:  # the selected cases, in the eval set's order (that of case_ids)
                    case, text = EvalCase.model_validate_json(data), data.decode()
                    for rep in reps:
                        yield InferItem(eval_id=case_id, repetition=rep, case_json=text,
                                        fingerprint=inference_fingerprint(identity, case, rep))

        part: list[InferItem] = []
        size = next(sizes, 0)
        for item in items():
            part.append(item)
            if len(part) == size:
                yield InferBatch(store_url=self.store_url, agent_dir=str(self.agent.path),
                                 agent_name=self.agent_name, framework=self.framework,
                                 eval_set_id=self.eval_set.eval_set_id,
                                 run_id=run.run_id, reuse=run.reuse,
                                 concurrency=run.concurrency, items=part)
                part, size = [], next(sizes, 0)

    def freeze_request(self, outcomes: Sequence[InferenceOutcome]) -> FreezeRequest:
        if self.agent is not None:
            app_name = self.agent.name
        elif outcomes:
            app_name = repo.get_inference(self.context.store, outcomes[0].oid).app_name
        else:
            app_name = self.eval_set.eval_set_id
        return FreezeRequest(store_url=self.store_url,
                             eval_set_json=self.eval_set.header.model_dump_json(),
                             rules=self.selected_rules(), app_name=app_name,
                             # RowList fields: rows or a list
                             cases=self.eval_set.selected(self.case_ids),  # type: ignore[arg-type]
                             outcomes=outcomes)  # type: ignore[arg-type]

    def score_requests(self, run: RunOptions, snapshot_oid: str) -> list[ScoreRequest]:
        """One request per metric of the snapshot."""
        snapshot = repo.get_snapshot(self.context.store, snapshot_oid)
        self.context.progress.expect("scoring", len(snapshot.cases) * len(snapshot.rules))
        keys = [(c.eval_id, c.repetition, c.case_fingerprint) for c in snapshot.cases]  # once
        return [ScoreRequest(
            store_url=self.store_url, snapshot_oid=snapshot_oid, metric_name=rule.metric_name,
            units_digest=reuse.units_digest([(eval_id, repetition,
                                              unit_fingerprint(case_fp, rule.rule_fingerprint))
                                             for eval_id, repetition, case_fp in keys]),
            trusted=rule.evaluator.trusted, judge=rule.judge, config_json=self.config_json,
            config_where=self.config.where, sys_paths=self.sys_paths,
            agent_dir=self.agent_dir, agent_name=self.agent_name, run_id=run.run_id,
            reuse=run.reuse, force=run.force, concurrency=run.concurrency)
            for rule in snapshot.rules]

    def publish_request(self, run: RunOptions, snapshot_oid: str,
                        outcomes: Sequence[InferenceOutcome],
                        units: Rows[UnitOutcome] | list[UnitOutcome]) -> PublishRequest:
        return PublishRequest(
            store_url=self.store_url, run_id=run.run_id, kind=run.kind, snapshot_oid=snapshot_oid,
            inference=outcomes, units=units,  # type: ignore[arg-type]  # RowList: Rows or list
            reuse=run.reuse, force=run.force, source=self.source,
            skipped_cases=self.skipped_cases, uninferred_cases=self.uninferred_cases,
            agent_dir=str(self.agent.path) if self.agent else None, prices=self.config.prices,
            coverage=self.coverage(), baseline=self.baseline, fail_on=self.fail_on)


def _select(plan: Plan, metrics: list[str] | None, cases: list[str] | None) -> None:
    known_metrics = [r.metric_name for r in plan.config.rules]
    unknown = sorted(set(metrics or []) - set(known_metrics))
    if unknown:
        raise UsageError(f"metrics {unknown} are not in the config; choose from {known_metrics}.")
    plan.metric_names = [m for m in known_metrics if not metrics or m in metrics]
    known_cases = plan.eval_set.ids
    missing = sorted(set(cases or []) - set(known_cases))
    if missing:
        raise UsageError(f"cases {missing} are not in eval set {plan.eval_set.eval_set_id}.")
    plan.case_ids = [c for c in known_cases if not cases or c in cases]
    _require_work(plan)


def _require_work(plan: Plan) -> None:
    """A run that would score nothing is a usage error, not a pass."""
    if not plan.case_ids:
        raise UsageError(f"eval set {plan.eval_set.eval_set_id} has no case to run; add eval "
                         "cases to it (a run that scores nothing cannot pass).")
    if not plan.metric_names:
        raise UsageError(f"config {plan.config.where} names no metric; add `criteria` to it "
                         "(a run that scores nothing cannot pass).")


def _union(*selections: list[str] | None) -> list[str] | None:
    """Cases named by ``FILE:ID,ID`` and by ``--case``; None (all) when neither names any."""
    ids = [c for sel in selections for c in sel or []]
    return list(dict.fromkeys(ids)) or None


def _select_in_several(plans: list[Plan], targets: list[EvalTarget], metrics: list[str] | None,
                       cases: list[str] | None) -> list[Plan]:
    """Selection over several eval sets: ``FILE:ID,ID`` names cases of its file; ``--case``
    and ``--metric`` apply wherever the case or metric exists, and must exist somewhere.
    An eval set left with no case or no metric is not run."""
    for name, wanted, have in (
            ("metrics", metrics, {r.metric_name for p in plans for r in p.config.rules}),
            ("cases", cases, {c for p in plans for c in p.eval_set.ids})):
        unknown = sorted(set(wanted or []) - have)
        if unknown:
            raise UsageError(f"{name} {unknown} are in none of the eval sets or configs of "
                             f"this run; choose from {sorted(have)}.")
    kept = []
    for plan, target in zip(plans, targets, strict=True):
        known_metrics = {r.metric_name for r in plan.config.rules}
        known_cases = set(plan.eval_set.ids)
        _select(plan, [m for m in metrics if m in known_metrics] if metrics else None,
                _union(target.case_ids, [c for c in cases or [] if c in known_cases]))
        if (metrics and not set(metrics) & known_metrics) or \
                (cases and not target.case_ids and not set(cases) & known_cases):
            continue
        kept.append(plan)
    return kept


def plan_runs(spec: RunSpec, ctx: RunContext, *, good: marks.GoodFn | None = None) -> list[Plan]:
    """One plan per eval set a run covers (:mod:`evalsnap.adk.targets`), in the order given;
    ``good`` is what ``--baseline last-good`` asks of a run (:func:`resolve_baseline`).

    ``spec.initial_session_file`` is ``AgentEvaluator``'s: the session state of old-format
    ``*.test.json`` files (an eval set file holds its own ``session_input``)."""
    if spec.kind != "run" or spec.agent_dir is None or not spec.evalsets:
        raise UsageError("a run needs an agent directory and at least one eval set.")
    if spec.repetitions < 1:
        raise UsageError("--repetitions must be at least 1.")
    if spec.until_stable is not None and spec.until_stable < spec.repetitions:
        raise UsageError(f"--until-stable {spec.until_stable} is below --repetitions "
                         f"{spec.repetitions}: MAX is the most repetitions a case may get, "
                         "so give at least as many as --repetitions.")
    check_gate(spec.repetition_gate)
    agent_dir, agent_name, framework = spec.agent_dir, spec.agent_name, spec.framework
    if not Path(agent_dir).is_dir():
        raise InputFileError(
            f"agent dir {agent_dir} does not exist; pass the directory of an ADK agent package.")
    agent_path = ensure_importable(agent_dir)
    targets = resolve_targets(agent_path, spec.evalsets, spec.config)
    initial_session = load_initial_session(spec.initial_session_file)
    eval_sets = [load_eval_cases(t.path, initial_session=initial_session) for t in targets]
    # The agent package is trusted live code, as in ADK: imported before the config is
    # resolved, so that models and evaluators it registers are there for the config.
    agent = load_agent(agent_dir, agent_name=agent_name, framework=framework)
    # the inference tasks of this process run exactly this agent, the one fingerprinted here
    use_agent(agent, str(agent.path), agent_name, framework)
    configs: dict[Path | None, LoadedConfig] = {}
    for target in targets:
        if target.config_path not in configs:
            configs[target.config_path] = load_config(target.config_path)
    store = ctx.store
    store.check()
    plans = [Plan(context=ctx, store_url=store.url, eval_set=eval_set, config=configs[target.config_path],
                  agent=agent, agent_dir=str(agent.path), agent_name=agent_name,
                  framework=framework, repetitions=spec.repetitions,
                  sys_paths=[str(agent_path.parent)], repetition_gate=spec.repetition_gate,
                  until_stable=spec.until_stable, fail_on=spec.fail_on)
             for target, eval_set in zip(targets, eval_sets, strict=True)]
    if len(plans) == 1:
        _select(plans[0], spec.metrics, _union(targets[0].case_ids, spec.cases))
    else:
        _check_distinct(plans, targets)
        plans = _select_in_several(plans, targets, spec.metrics, spec.cases)
    for plan in plans:
        plan.baseline = resolve_baseline(store, spec.baseline or "", plan.eval_set.eval_set_id,
                                         spec.tolerance, spec.alpha, good=good)
    return plans


def resolve_baseline(store: Any, ref: str, eval_set_id: str, tolerance: float,
                     alpha: float = 0.05, *, good: marks.GoodFn | None = None) -> Baseline | None:
    """The record ``--baseline REF`` names: a run or record id of the same eval set;
    ``latest``, the newest *full* run of it; or ``last-good``, the newest full run of it that
    was accepted or passed its own gate (``good`` says whether a run did:
    :func:`evalsnap.reports.lastgood.is_good`). With none yet: no comparison, a warning."""
    if not ref:
        return None
    if tolerance < 0:
        raise UsageError(f"--tolerance must be 0 or more, not {tolerance}.")
    if not 0 < alpha < 1:
        raise UsageError(f"--alpha must be between 0 and 1, not {alpha}.")
    if ref == marks.LAST_GOOD:
        if good is None:
            raise TypeError("resolve_baseline: `last-good` needs `good` (whether a run "
                            "passed its gate: evalsnap.reports.lastgood.is_good)")
        found = marks.last_good(store, eval_set_id, good)
        if found is None:
            logger.warning("no earlier full run of eval set %s in store %s was accepted or "
                           "passed its gate: nothing to compare with (--baseline last-good); "
                           "regressions are counted from the next good run on", eval_set_id,
                           store.url)
            return Baseline(requested=ref, tolerance=tolerance, alpha=alpha)
        logger.info("--baseline last-good of eval set %s: run %s (%s)", eval_set_id,
                    found.manifest.run_id, found.why)
        return Baseline(requested=ref, record_oid=found.manifest.record_oid,
                        run_id=found.manifest.run_id, tolerance=tolerance, alpha=alpha)
    if ref == "latest":
        manifest = repo.latest_manifest(store, eval_set_id=eval_set_id, fallback=False)
        if manifest is None:
            logger.warning("no earlier full run of eval set %s in store %s: nothing to compare "
                           "with (--baseline latest); regressions are counted from the next "
                           "run on", eval_set_id, store.url)
            return Baseline(requested=ref, tolerance=tolerance, alpha=alpha)
        return Baseline(requested=ref, record_oid=manifest.record_oid, run_id=manifest.run_id,
                        tolerance=tolerance, alpha=alpha)
    oid, record = repo.resolve_record(store, ref)
    if record.eval_set_id != eval_set_id:
        raise UsageError(f"baseline {ref} is a record of eval set {record.eval_set_id!r}, not "
                         f"{eval_set_id!r}; compare with a run of the same eval set "
                         "(or --baseline latest, or last-good).")
    return Baseline(requested=ref, record_oid=oid, run_id=record.run_id, tolerance=tolerance,
                    alpha=alpha)


def _check_distinct(plans: list[Plan], targets: list[EvalTarget]) -> None:
    """Records, ``latest`` and ``diff`` go by eval set id: two files of one run may not share one."""
    first: dict[str, Path] = {}
    for plan, target in zip(plans, targets, strict=True):
        set_id = plan.eval_set.eval_set_id
        if set_id in first:
            raise UsageError(f"{first[set_id]} and {target.path} have the same eval_set_id "
                             f"{set_id!r}; records are kept per eval set, so give each file "
                             "its own eval_set_id or run them separately.")
        first[set_id] = target.path


def resolve_snapshot(store: Any, ref: str) -> tuple[str, Snapshot]:
    """A snapshot by id, or the snapshot of a run or record."""
    hex_part = repo.hexof(ref)
    if ref.startswith("sha256:") or len(hex_part) == 64:
        oid = ref if ref.startswith("sha256:") else "sha256:" + ref
        try:
            return oid, repo.get_snapshot(store, oid)
        except NotFoundError:
            pass
    record_oid, record = repo.resolve_record(store, ref)
    if record.snapshot_oid is None:
        raise NotFoundError(f"record {record_oid} was imported from ADK history and has no "
                            "snapshot to rescore.")
    return record.snapshot_oid, repo.get_snapshot(store, record.snapshot_oid)


def _config_from_snapshot(snapshot: Snapshot) -> LoadedConfig:
    customs = [r.metric_name for r in snapshot.rules if r.evaluator.kind == "custom_function"]
    if customs:
        raise ConfigError(
            f"snapshot rules name custom metric(s) {customs}; evalsnap never imports code named "
            "in a stored record, so pass --config with their customMetrics entries.")
    raw = {"criteria": {r.metric_name: r.criterion for r in snapshot.rules}}
    return resolve_config(raw, where="<rules of the snapshot>")


def plan_rescore(spec: RunSpec, ctx: RunContext, *, good: marks.GoodFn | None = None) -> Plan:
    """The plan of a rescore: the frozen inference of ``spec.source``, with the references
    of ``spec.evalsets`` (else the frozen ones) and the rules of ``spec.config`` (else the
    frozen ones); its ``code_paths`` and ``agent_dir`` are imported first, never called."""
    if spec.kind != "rescore" or not spec.source:
        raise UsageError("a rescore needs the run, record or snapshot to score again.")
    run_or_snapshot, config, agent_dir, agent_name = (spec.source, spec.config, spec.agent_dir,
                                                      spec.agent_name)
    evalset = spec.evalsets[0] if spec.evalsets else None
    sys_paths: list[str] = list(spec.code_paths)
    store = ctx.store
    store.check()
    snapshot_oid, snapshot = resolve_snapshot(store, run_or_snapshot)
    source_note = _subset_source(store, run_or_snapshot, snapshot_oid)
    if agent_dir is not None:
        # ``--agent``: the user names the package (never the record); imported first, as for
        # a run, so that what it registers is there for the config (it is never called)
        root = str(ensure_importable(agent_dir).parent)
        sys_paths += [] if root in sys_paths else [root]
        agent_dir = str(load_agent(agent_dir, agent_name=agent_name).path)
    if config is not None:
        # custom metrics live in the agent package, beside its test_config.json (as adk eval);
        # the edited eval set may live anywhere, so its parent alone is not enough
        root = str(Path(config).resolve().parent.parent)
        sys_paths += [] if root in sys_paths else [root]
    for p in sys_paths:
        ensure_importable(Path(p) / "_")
    if evalset is not None:
        eval_set = load_eval_cases(evalset)
    else:
        refs = {c.eval_id: c.reference for c in snapshot.cases}
        eval_set = EvalCases.of(EvalSet(
            eval_set_id=snapshot.eval_set_id, name=snapshot.eval_set_name,
            eval_cases=[EvalCase.model_validate(r) for r in refs.values()]))
    config_path = config or (default_config_path(evalset) if evalset else None)
    loaded = load_config(config_path) if config_path else _config_from_snapshot(snapshot)
    new_ids = set(eval_set.ids)
    frozen_ids = {c.eval_id for c in snapshot.cases}
    plan = Plan(context=ctx, store_url=store.url, eval_set=eval_set, config=loaded, source=run_or_snapshot,
                agent_dir=agent_dir, agent_name=agent_name,
                sys_paths=sys_paths,
                skipped_cases=sorted(frozen_ids - new_ids),
                uninferred_cases=sorted(new_ids - frozen_ids), source_note=source_note,
                repetition_gate=check_gate(spec.repetition_gate), fail_on=spec.fail_on)
    _select(plan, spec.metrics, spec.cases)
    # cases left out by --case are not "without inference": the selection does not ask for them
    inferred = set(plan.case_ids)
    plan.uninferred_cases = [c for c in plan.uninferred_cases if c in inferred]
    plan.case_ids = [c for c in plan.case_ids if c in frozen_ids]
    if not plan.case_ids:
        raise UsageError(f"none of the selected cases has frozen inference in {run_or_snapshot} "
                         f"(it has {sorted(frozen_ids)}); rescore scores frozen inference only "
                         "— run the agent on new cases with `evalsnap run`.")
    selected = set(plan.case_ids)
    plan.source_outcomes = [
        InferenceOutcome(eval_id=c.eval_id, repetition=c.repetition, oid=c.inference_oid,
                         fingerprint=c.inference_fingerprint,
                         status="success" if c.inference_ok else "failure",
                         run_id=repo.inference_run_id(store, c.inference_oid))
        for c in snapshot.cases if c.eval_id in selected]
    plan.baseline = resolve_baseline(store, spec.baseline or "", plan.eval_set.eval_set_id,
                                     spec.tolerance, spec.alpha, good=good)
    return plan


def _subset_source(store: Any, ref: str, snapshot_oid: str) -> str | None:
    """Why a rescore's source covers only part of its eval set or config (None: it is full).

    A run or record says it itself; a bare snapshot id is as full as the newest record of
    it (records written before coverage was recorded are full)."""
    try:
        oid, record = repo.resolve_record(store, ref)
    except NotFoundError:
        records = [m for m in repo.list_manifests(store) if m.snapshot_oid == snapshot_oid]
        full = records[0].full is not False if records else True
        return None if full else f"snapshot {snapshot_oid} was frozen by a subset run"
    if record.full:
        return None
    return f"the source {ref} ({record.run_id}) covers only part of its eval set or config"


def record_of(store: Any, ref: str) -> tuple[str, EvaluationRecord]:
    return repo.resolve_record(store, ref)
