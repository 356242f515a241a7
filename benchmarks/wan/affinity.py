"""Pinning a region's processes to its own CPUs, so that regions behave like separate machines.

On one host, the trainer's encoder and the remote actors' decoders otherwise share every core: a stage that is
CPU-bound at home then slows a CPU-bound stage in the remote region, which separate machines never do, and an
overlap of the two (cut-through) cannot show. Pinning gives each region its own cores for as long as it lasts.

Affinity is per thread: :func:`pin_tree` sets it on every thread of a process and of all its descendants (new
threads and children inherit it from then on). Processes that exit meanwhile are skipped.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection
from pathlib import Path


def all_cpus() -> frozenset[int]:
    """The CPUs this process may run on (a container may allow fewer than the machine has)."""
    return frozenset(os.sched_getaffinity(0))


def split_cpus(regions: Collection[str], cpus: Collection[int] | None = None) -> dict[str, frozenset[int]] | None:
    """Deal ``cpus`` (default: all allowed) out to ``regions`` in contiguous, near-equal shares; ``None`` when
    there are fewer CPUs than regions (nothing to separate)."""
    pool = sorted(all_cpus() if cpus is None else cpus)
    names = list(regions)
    if len(pool) < len(names) or not names:
        return None
    share, extra = divmod(len(pool), len(names))
    out, start = {}, 0
    for i, name in enumerate(names):
        size = share + (1 if i < extra else 0)
        out[name] = frozenset(pool[start:start + size])
        start += size
    return out


def _threads(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    return []


def _children_by_parent() -> dict[int, list[int]]:
    """Every live process's pid under its parent's, read once from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                # the parent pid is the 2nd field after the ")" that closes the command name
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    return children


def pin_tree(pid: int, cpus: Collection[int]) -> int:
    """Restrict every thread of ``pid`` and of its descendants to ``cpus``; return how many threads were set."""
    allowed = set(cpus)
    children = _children_by_parent()
    count, pending = 0, [pid]
    while pending:
        current = pending.pop()
        for tid in _threads(current):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.sched_setaffinity(tid, allowed)
                count += 1
        pending.extend(children.get(current, ()))
    return count
