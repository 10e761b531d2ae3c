"""Prefect flows: they only wire tasks (see the pipeline diagram in DESIGN.md)."""

from flows.evaluate import evaluate
from flows.rescore import rescore

__all__ = ["evaluate", "rescore"]
