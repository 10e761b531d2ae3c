"""evalsnap: auditable, reusable evaluations of Google ADK agents as Prefect flows.

The domain and the command line live here; ``storage`` holds the store, ``tasks`` and
``flows`` the Prefect adapters. Import submodules directly (``evalsnap.pipeline.plan``,
``evalsnap.records``…); nothing heavy is imported by this package itself, and importing
any evalsnap module registers, patches, starts and mutes nothing: the command line's
start-up tricks (:mod:`evalsnap.startup`) run from its ``main`` only.
"""

__version__ = "0.1.0"

__all__ = ["RunResult", "__version__", "evaluate", "rescore"]


def __getattr__(name: str) -> object:
    """``evalsnap.evaluate``, ``evalsnap.rescore`` and ``evalsnap.RunResult`` (the Python API,
    :mod:`evalsnap.api`), imported on first use so that ``import evalsnap`` stays light."""
    if name in ("evaluate", "rescore", "RunResult"):
        from evalsnap import api

        return getattr(api, name)
    raise AttributeError(f"module 'evalsnap' has no attribute {name!r}")
