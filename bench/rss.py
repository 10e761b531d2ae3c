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


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    out, command = argv[0], argv[2:]
    start = time.monotonic()
    proc = subprocess.Popen(command)
    peaks: dict[int, tuple[float, str]] = {}
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
                if mb > peaks.get(pid, (0.0, ""))[0]:
                    peaks[pid] = (mb, name)
                samples.append((round(time.monotonic() - start, 1), pid, round(mb)))
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    done.set()
    sampler.join()
    print(f"wall {time.monotonic() - start:.1f} s, exit {code}", file=sys.stderr)
    for pid, (mb, name) in sorted(peaks.items(), key=lambda kv: -kv[1][0])[:6]:
        print(f"{mb:8.0f} MB  {pid}  {name}", file=sys.stderr)
    with open(out, "w") as f:
        json.dump(samples, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
