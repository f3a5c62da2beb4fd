"""Run study parts (shell-free commands) on a few workers, each pinned to its own core.

The studies' small models scale poorly over cores within one process, so two processes, one
per core, finish a study faster than one process on both. Parts are taken in the order given
(longest first balances the workers); every part's output goes to its own log, and the wall
time of each part and of the whole is returned for the results to record.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path


def pinned(command: Sequence[str], core: int | None) -> list[str]:
    """`command` under `taskset -c core` when a core is given, else as it is."""
    return list(command) if core is None else ["taskset", "-c", str(core), *command]


def run_parts(parts: Sequence[tuple[str, Sequence[str]]], workers: int, log_dir: str | Path,
              pin: bool = True, log=print) -> dict:
    """Run named commands, `workers` at a time, worker i pinned to the i-th core this process may
    use when `pin` (and there are that many, and taskset exists).

    parts: (name, argv) pairs, started in this order. Returns {"wall_s", "parts": [{name, argv,
    core, returncode, started_s, wall_s, log}]} with started_s relative to the start. A failed
    part does not stop the others; its return code says so.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    todo: queue.Queue = queue.Queue()
    for part in parts:
        todo.put(part)
    done: list[dict] = []
    lock = threading.Lock()  # one worker's log line at a time
    start = time.time()

    def say(message: str):
        with lock:
            log(message)

    cores = sorted(os.sched_getaffinity(0)) if pin and shutil.which("taskset") else []  # [] pins nothing

    def worker(i: int):
        core = cores[i] if i < len(cores) else None
        while True:
            try:
                name, argv = todo.get_nowait()
            except queue.Empty:
                return
            path = log_dir / f"{name}.log"
            t0 = time.time()
            say(f"[core {core}] start {name}")
            with open(path, "w") as f:
                code = subprocess.call(pinned(argv, core), stdout=f, stderr=subprocess.STDOUT)
            row = {"name": name, "argv": list(argv), "core": core, "returncode": code,
                   "started_s": round(t0 - start, 1), "wall_s": round(time.time() - t0, 1), "log": str(path)}
            done.append(row)
            say(f"[core {core}] {name}: exit {code} after {row['wall_s']:.0f}s")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"wall_s": round(time.time() - start, 1), "parts": sorted(done, key=lambda r: r["started_s"])}
