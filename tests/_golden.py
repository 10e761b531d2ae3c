"""One cold run of the demo per test session, copied for each module that needs one.

A cold run of the demo (13 cases, every metric, the judge) is the most expensive thing the
suite does, and several modules only need *a* store holding one, to damage, rescore or read.
:func:`golden_demo` makes it once per session — under pytest-xdist once for all workers (the
first builds it under a file lock, the others wait and read it) — in
``<root>/agents/shop_agent`` and ``<root>/store``; :meth:`GoldenDemo.copy` copies both to a
module's own directory (``shutil.copytree``) and gives the run's result with its paths
moved there. A test that checks what a cold run itself does runs its own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests._cli import CliResult, run_inproc

__all__ = ["GoldenDemo", "build_golden_demo"]

_DONE = "result.json"


@dataclass(frozen=True)
class GoldenDemo:
    root: Path

    def copy(self, dst: Path) -> tuple[Path, Path, CliResult]:
        """``(agent, store, cold)`` in ``dst``: the demo agent's copy (its ADK history
        included), the store of its cold run, and that run's result."""
        dst.mkdir(parents=True, exist_ok=True)
        for part in ("agents", "store"):
            shutil.copytree(self.root / part, dst / part,
                            ignore=shutil.ignore_patterns("__pycache__"))
        done = json.loads((self.root / _DONE).read_text("utf-8"))
        stdout = done["stdout"].replace(str(self.root), str(dst))
        result = CliResult(subprocess.CompletedProcess([], done["code"], stdout, done["stderr"]))
        return dst / "agents" / "shop_agent", dst / "store", result


def build_golden_demo(root: Path) -> GoldenDemo:
    """The demo's cold run in ``root`` (made by the first caller, under a lock)."""
    from filelock import FileLock

    from tests.conftest import copy_shop

    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        if not (root / _DONE).is_file():
            agent = copy_shop(root / "agents" / "shop_agent")
            cold = run_inproc("run", str(agent), str(agent / "shop.evalset.json"), "--store",
                              str(root / "store"), "--json")
            assert cold.code in (1, 3), cold.stderr[-3000:]  # the demo has failing cases
            cold.json  # noqa: B018 - one JSON line, or the assertion says what came instead
            (root / _DONE).write_text(json.dumps(
                {"code": cold.code, "stdout": cold.stdout, "stderr": cold.stderr}), "utf-8")
    return GoldenDemo(root)
