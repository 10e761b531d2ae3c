"""The retention flow: ``evalsnap gc`` as a Prefect flow (the weekly ``gc`` deployment)."""

from __future__ import annotations

from typing import Annotated, Any

from prefect import flow
from pydantic import Field

from evalsnap.records import repo
from evalsnap.records.gc import DEFAULT_GRACE, collect, parse_duration
from evalsnap.reports.lastgood import is_good
from evalsnap.reports.site import after_gc
from tasks.support import STORE_DEFAULT, with_parameter_docs


def _markdown(report: dict[str, Any]) -> str:
    verb = "would remove" if report["dry_run"] else "removed"
    lines = [f"# gc of `{report['store']}`", "",
             f"* {report['removed_count']} file(s), {report['removed_bytes']:,} bytes {verb}",
             f"* runs kept: {len(report['runs_kept'])}, {verb}: {len(report['runs_removed'])}",
             f"* grace period: {report['grace_seconds']:g} s"]
    if report["objects_deferred"]:
        lines.append(f"* objects deferred: {report['objects_deferred']}")
    lines += ["", "| kind | kept | " + verb + " | bytes | deferred |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {c['kept']} | {c['removed']} | {c['bytes']:,} | {c['deferred']} |"
              for k, c in report["kinds"].items() if c["kept"] or c["removed"] or c["deferred"]]
    lines += [f"* {w}" for w in report["warnings"]]
    return "\n".join(lines)


@flow(name="evalsnap-gc", validate_parameters=True)
@with_parameter_docs
def gc(
    store: Annotated[str, Field(description=(
        f"Store URL: a local path, s3://…, gs://…; empty: {STORE_DEFAULT}"))] = "",
    keep_last: Annotated[int, Field(ge=0, description=(
        "Keep the newest N runs of each eval set (0: no count rule); the newest run, the "
        "newest full run and the last-good run of each eval set, and pinned and accepted "
        "runs, are always kept"))] = 14,
    older_than_days: Annotated[float, Field(ge=0, description=(
        "Remove runs older than this many days (0: no age rule); with keep_last, only runs "
        "beyond the newest N"))] = 0,
    grace: Annotated[str, Field(description=(
        "Nothing younger is removed, and objects wait while a run started within it "
        "(e.g. 1h, 30m); keep it above the longest run"))] = f"{DEFAULT_GRACE / 3600:g}h",
    dry_run: Annotated[bool, Field(description="Only report what would be removed")] = False,
) -> dict[str, Any]:
    """Remove old runs and every object no kept run names; safe while other runs write."""
    from prefect.artifacts import create_markdown_artifact

    from evalsnap import settings

    opened = repo.open_store(store or settings.get().store)
    found = collect(opened, good=is_good, keep_last=keep_last or None,
                    older_than_days=older_than_days or None, grace=parse_duration(grace),
                    dry_run=dry_run)
    after_gc(opened, found)  # the site stops listing and linking the removed runs
    report = found.as_dict()
    create_markdown_artifact(markdown=_markdown(report), key="evalsnap-gc",
                             description="What evalsnap gc kept and removed")
    return {k: v for k, v in report.items() if k != "removed"}
