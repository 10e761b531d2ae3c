"""Prefect tasks: thin adapters over ``evalsnap.pipeline``, each taking one request model."""

from tasks.freeze import freeze_task
from tasks.inference import InferenceFailed, infer_task, run_inference
from tasks.publish import publish_task
from tasks.score import run_scoring, score_task, scoring_pool

__all__ = ["InferenceFailed", "freeze_task", "infer_task", "publish_task", "run_inference",
           "run_scoring", "score_task", "scoring_pool"]
