"""Files other processes read while we write: whole files replaced atomically, JSON, and locks.

Every whole-file write in resaware goes through `replacing` (write a temporary file beside the target,
fsync it, rename it over the target): a reader, or a process killed mid-write, sees the old file or the
new one, never half. Locks are filelock's (an flock on Unix): `locked` holds the process's one,
re-entrant lock of a file, so a function holding it may call one that takes it again; `try_lock` takes
a lock of its own that even another holder in this process excludes (per-core claims).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from resaware.errors import ResawareError


@contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside `path` to write (by any means: TVM writes some files itself); when the
    block ends it is fsynced and renamed over `path`; if the block raises, it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)  # TVM reads the suffix
    umask = os.umask(0)  # mkstemp makes the file private to its owner; give it the mode `open` would
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace the file `path` with `data`, atomically."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: str | os.PathLike, data) -> None:
    """Replace the file `path` with `data` as JSON, atomically."""
    write_bytes(path, json.dumps(data, indent=1, sort_keys=True).encode())


def read_json(path: str | os.PathLike, default=None):
    """The JSON in `path`, `default` when it does not exist; a clear error when it is damaged."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return default
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ResawareError(f"{path} is not valid JSON ({error}): restore it or remove the file") from None


def lock(path: str | os.PathLike) -> FileLock:
    """The process's one lock object for the lock file `path` (re-entrant; shared by every thread)."""
    return FileLock(str(path), thread_local=False, is_singleton=True, preserve_lock_file=True)


@contextmanager
def locked(path: str | os.PathLike, busy: str | None = None) -> Iterator[None]:
    """Hold the lock file `path`, waiting for it; with `busy`, don't wait: if another process holds it,
    raise a ResawareError saying `busy`."""
    held = lock(path)
    try:
        held.acquire(blocking=busy is None)
    except Timeout:
        raise ResawareError(busy) from None
    try:
        yield
    finally:
        held.release()


def try_lock(path: str | os.PathLike) -> FileLock | None:
    """A lock on `path` held now if nobody holds it (another lock object of this process included),
    else None. It is released by `release()` or when the process ends."""
    held = FileLock(str(path), thread_local=False, preserve_lock_file=True)
    try:
        held.acquire(blocking=False)
    except Timeout:
        return None
    return held
