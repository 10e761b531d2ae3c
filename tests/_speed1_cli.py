"""A cheaper :func:`tests._cli.run_inproc` for the modules that use this fixture.

``run_inproc`` tells user code (agent packages, metrics, plugins) from the rest by resolving
the file of every module in ``sys.modules`` (:func:`tests._cli._user_module`), twice per call:
with ADK and Prefect imported that is ~5,000 ``Path.resolve`` calls (an ``lstat`` per path
component), ~0.3 s of CPU per scan and far more wall time on a loaded machine. Whether a
file lies outside the installed environment and the product's packages does not change
during a session, so :func:`fast_user_module_scan` (module-scoped, autouse) memoises the
answer per file path for the module's tests and restores the original afterwards. What is
imported afresh and forgotten per call is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module", autouse=True)
def fast_user_module_scan() -> Iterator[None]:
    from tests import _cli

    original = _cli._user_module
    known: dict[str, bool] = {}

    def user_module(module: Any) -> bool:
        file = getattr(module, "__file__", None)
        if not isinstance(file, str):
            return original(module)
        hit = known.get(file)
        if hit is None:
            hit = known[file] = original(module)
        return hit

    _cli._user_module = user_module
    try:
        yield
    finally:
        _cli._user_module = original
