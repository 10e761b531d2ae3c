"""Freeze task: a thin adapter over ``evalsnap.pipeline.freeze``."""

from __future__ import annotations

from prefect import task

from evalsnap.pipeline import context
from evalsnap.pipeline.freeze import FreezeRequest, freeze


@task(name="freeze", persist_result=False)
def freeze_task(request: FreezeRequest) -> str:
    """Writes the run's snapshot; returns its id."""
    return freeze(request, context.of(request.store_url).store)
