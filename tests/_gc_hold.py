"""``python -m tests._gc_hold HOLD_DIR gc …``: ``evalsnap gc`` in a process of its own
(as ``python -m evalsnap.cli``), held at one point of its sweep until the test lets it go.

gc deletes in a fixed order (:data:`evalsnap.records.gc._DELETE_ORDER`): run manifests,
index entries, cached results, reports, ADK history copies, temporary files, then objects,
reading ``v1/STORE`` again before each batch of those that wait for quiet. Just before it
deletes temporary files — after every run manifest, index entry and cached result it removes
this time, before the first object — this process writes ``HOLD_DIR/held`` and waits until
``HOLD_DIR/go`` exists: a slow gc (one that had thousands of temporary files to sweep
there), made deterministic. Nothing else of gc changes; the hold is outside any store call.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def _install(hold: Path) -> None:
    # storage.gc is light (no ADK, no Prefect); evalsnap.records.gc takes delete_files from
    # it by name when the gc command imports it, after this
    import storage.gc

    original = storage.gc.delete_files
    state = {"held": False}

    def delete_files(store, files, **kwargs):  # type: ignore[no-untyped-def]
        files = list(files)
        if not state["held"] and any(f.rel.rsplit("/", 1)[-1].startswith(".tmp-")
                                     for f in files):
            state["held"] = True
            (hold / "held").touch()
            while not (hold / "go").exists():
                time.sleep(0.02)
        return original(store, files, **kwargs)

    storage.gc.delete_files = delete_files


if __name__ == "__main__":
    hold_dir = Path(sys.argv.pop(1))
    _install(hold_dir)
    sys.argv[0] = "evalsnap"
    from evalsnap.cli import main

    main()
