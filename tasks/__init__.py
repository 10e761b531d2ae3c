"""Prefect tasks: thin adapters over ``evalsnap`` stage functions."""

from tasks.freeze import freeze_task
from tasks.inference import InferenceFailed, infer_task
from tasks.publish import publish_task
from tasks.score import score_task

__all__ = ["InferenceFailed", "freeze_task", "infer_task", "publish_task", "score_task"]
