"""Child processes that die with their parent: Prefect's temporary API and the scoring worker.

A parent killed with SIGKILL or SIGTERM runs no exit handler, so it cannot stop its children.
:func:`module_command` runs ``python -m <module> <args>`` in a child that the kernel sends
SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``, armed before the module runs; the
child exits at once if the parent is already gone). The launcher is plain ``-c`` code, so
the child imports nothing of evalsnap that the module itself does not.
"""

from __future__ import annotations

import os
import sys

_LAUNCHER = """
import ctypes, os, runpy, signal, sys
if sys.platform == "linux":
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
if os.getppid() != int(sys.argv.pop(1)):
    sys.exit(0)  # the parent died before the signal was armed
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


def module_command(module: str, *args: str) -> list[str]:
    """The argv for ``python -m module *args`` in a child that dies with this process."""
    return [sys.executable, "-c", _LAUNCHER, str(os.getpid()), module, *args]
