"""A process's descendants, wherever they moved: found through /proc and killed, children first.

`os.killpg` misses a process that left its group (`setsid`, a double fork, `start_new_session=True`), and the
standard library has no walk of a process tree; /proc lists each task's children, whatever session or group they
are in. Used by the sandbox's host (the kill at the time limit) and by the reward functions' processes (what a
function leaves running at close).
"""

from __future__ import annotations

import os
import signal
import time


def descendants(pid: int) -> list[int]:
    """`pid`'s living descendants, parents before children, from `/proc/<pid>/task/<tid>/children` (Linux; [] where
    there is no /proc). A zombie (ended, not reaped) is left out: it holds no file and runs nothing."""
    found, pending = [], [pid]
    while pending and len(found) < 100_000:
        parent = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                continue
            for child in children:
                try:
                    with open(f"/proc/{child}/stat") as f:
                        if f.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                            continue
                except (OSError, IndexError):
                    continue
                found.append(child)
                pending.append(child)
    return found


def kill_descendants(pid: int, rounds: int = 50) -> int:
    """SIGKILLs `pid`'s descendants (`descendants`), children before parents, and again while any lives (one forked
    meanwhile, one `pid` adopted as a subreaper); returns how many it killed. `pid` itself is left alive: while it
    lives, what its descendants leave (orphans, when it is a subreaper) stays in its tree, found here."""
    killed = set()
    for _ in range(rounds):
        living = descendants(pid)
        if not living:
            break
        for child in reversed(living):
            try:
                os.kill(child, signal.SIGKILL)
                killed.add(child)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)  # a killed process is listed until it is a zombie
    return len(killed)
