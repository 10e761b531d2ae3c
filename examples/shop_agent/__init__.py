"""The demo shop assistant, in the package shape ``adk eval`` and ``evalsnap run`` load."""

from . import agent

__all__ = ["agent"]
