"""Peak RSS of a command and of every process it starts, sampled every 0.5 s.

``python -m bench.rss OUT.json -- evalsnap run AGENT EVALSET --store DIR --json``: runs the
command, prints its wall time and exit code, then each process's peak RSS (largest first);
writes the samples (seconds, pid, MB) to ``OUT.json``. Processes a thread of the command
starts (a scoring process, the temporary Prefect API) are followed too. The 10,000-case
numbers of bench/RESULTS.md ("stop 41") were taken with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any


def _family(pid: int) -> list[int]:
    """``pid`` and its descendants (children of any of its threads)."""
    found = [pid]
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                children = f.read().split()
        except OSError:
            continue
        for child in children:
            found += _family(int(child))
    return found


def sampled(command: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
            quiet: bool = False) -> dict[str, Any]:
    """Runs ``command`` (its output to ``/dev/null`` when ``quiet``) sampling the RSS of it
    and of every process it starts every 0.5 s: ``wall`` (s), ``code``, ``peaks`` (by pid:
    ``mb``, ``at`` (s into the run), ``name``), ``samples`` ((s, pid, MiB) each) and
    ``started`` (when it started, seconds since the epoch)."""
    started, start = time.time(), time.monotonic()
    out = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=out)
    peaks: dict[int, dict[str, Any]] = {}
    samples: list[tuple[float, int, int]] = []
    done = threading.Event()

    def sample() -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not done.is_set():
            for pid in _family(proc.pid):
                try:
                    with open(f"/proc/{pid}/statm") as f:
                        mb = int(f.read().split()[1]) * page / 2**20
                    with open(f"/proc/{pid}/cmdline") as f:
                        name = f.read().replace("\0", " ")[:90]
                except OSError:
                    continue
                at = round(time.monotonic() - start, 1)
                if mb > peaks.get(pid, {"mb": 0.0})["mb"]:
                    peaks[pid] = {"mb": mb, "at": at, "name": name}
                samples.append((at, pid, round(mb)))
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    done.set()
    sampler.join()
    return {"wall": time.monotonic() - start, "code": code, "peaks": peaks, "samples": samples,
            "started": started}


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    out, command = argv[0], argv[2:]
    run = sampled(command)
    print(f"wall {run['wall']:.1f} s, exit {run['code']}", file=sys.stderr)
    for pid, peak in sorted(run["peaks"].items(), key=lambda kv: -kv[1]["mb"])[:6]:
        print(f"{peak['mb']:8.0f} MB  {pid}  at {peak['at']:.0f} s  {peak['name']}",
              file=sys.stderr)
    with open(out, "w") as f:
        json.dump(run["samples"], f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
