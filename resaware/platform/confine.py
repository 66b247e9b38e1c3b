"""Confining a process to a core set: affinity on every thread and TVM's thread count.

Linux affinity is per thread, and TVM's thread pool pins its own threads unless told not to, so
confinement sets the environment before any pool starts and pins every existing thread.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity), sorted."""
    return sorted(os.sched_getaffinity(0))


def thread_ids() -> list[int]:
    """The ids of this process's threads (`/proc/self/task`)."""
    return [int(t) for t in os.listdir("/proc/self/task")]


def thread_masks() -> dict[int, set[int]]:
    """Every thread's affinity, read from `/proc/self/task/*`."""
    masks = {}
    for tid in thread_ids():
        try:
            masks[tid] = set(os.sched_getaffinity(tid))
        except (ProcessLookupError, PermissionError):
            pass  # the thread ended between listing and reading
    return masks


def environment(count: int) -> dict[str, str]:
    """Variables that keep TVM (and OpenMP) at `count` threads without re-pinning them."""
    return {
        "TVM_NUM_THREADS": str(count),
        "TVM_BIND_THREADS": "0",
        "OMP_NUM_THREADS": str(count),
    }


def pin_threads(cores: Iterable[int]) -> None:
    """Pin every thread of this process to `cores` (new threads inherit it)."""
    cores = set(cores)
    for tid in thread_ids():
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:
            pass


def enter(cores: Iterable[int]) -> None:
    """Confine this process for good: the environment first, then every thread."""
    cores = sorted(set(cores))
    os.environ.update(environment(len(cores)))
    pin_threads(cores)


@contextmanager
def pinned(cores: Iterable[int]) -> Iterator[None]:
    """Pin every thread of this process to `cores`, then give each its old mask back."""
    before = thread_masks()
    pin_threads(cores)
    try:
        yield
    finally:
        default = set().union(*before.values()) if before else set(usable_cores())
        for tid in thread_ids():
            try:
                os.sched_setaffinity(tid, before.get(tid, default))
            except ProcessLookupError:
                pass


def run_pinned(argv: list[str], cores: Iterable[int], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `argv` in a child confined to `cores` from its first instruction (affinity + thread counts)."""
    cores = sorted(set(cores))
    return subprocess.run(
        argv,
        env={**os.environ, **(env or {}), **environment(len(cores))},
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cores),
    )
