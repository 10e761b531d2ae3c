"""evalsnap: auditable, reusable evaluations of Google ADK agents as Prefect flows.

The domain and the command line live here; ``storage`` holds the store, ``tasks`` and
``flows`` the Prefect adapters. Import submodules directly (``evalsnap.stages``,
``evalsnap.records``…); nothing heavy is imported by this package itself.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
