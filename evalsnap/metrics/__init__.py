"""Metrics evalsnap adds to ADK's registry."""

from evalsnap.metrics.final_state_match import FinalStateMatchEvaluator, register

__all__ = ["FinalStateMatchEvaluator", "register"]
