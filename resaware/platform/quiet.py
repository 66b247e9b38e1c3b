"""Silencing TVM's native warnings that a user cannot act on.

TVM's C++ side logs straight to file descriptor 2 (e.g. one "Scope Saving" line per kernel when a
library is exported, "Unknown schedule rule meta_schedule.pool_max" per pooling task). Errors still
arrive as Python exceptions, so muting the descriptor around such calls loses nothing a user needs.
"""

from __future__ import annotations

import io
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


def stderr_is_fd2() -> bool:
    """Whether Python's stderr writes to file descriptor 2 (not so in Jupyter, whose stream goes to the notebook)."""
    try:
        return isinstance(sys.stderr, io.TextIOWrapper) and sys.stderr.fileno() == 2
    except (OSError, ValueError):
        return False


@contextmanager
def native_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for the duration (Python's own stderr is kept)."""
    if os.environ.get("RESAWARE_VERBOSE"):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    stderr = sys.stderr
    if stderr_is_fd2():  # Python writes still reach the user
        sys.stderr = os.fdopen(os.dup(saved), "w", closefd=True)
    try:
        yield
    finally:
        if sys.stderr is not stderr:
            sys.stderr.flush()
            sys.stderr.close()
            sys.stderr = stderr
        os.dup2(saved, 2)
        os.close(saved)


@contextmanager
def xgboost_warnings() -> Iterator[None]:
    """TVM saves XGBoost models as `model.bin`, which XGBoost warns about on every save and load."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Unknown file format.*")
        warnings.filterwarnings("ignore", message=".*Saving model in the UBJSON format.*")
        warnings.filterwarnings("ignore", category=UserWarning, module="tvm.s_tir.meta_schedule.cost_model.xgb_model")
        yield


@contextmanager
def no_notebook_tables() -> Iterator[None]:
    """In a Jupyter kernel MetaSchedule redraws a pandas table after every batch (and fails without pandas);
    resaware reports progress itself, so it tells MetaSchedule it is not in a notebook for the duration."""
    import tvm_ffi

    name = "s_tir.meta_schedule.using_ipython"
    saved = tvm_ffi.get_global_func(name, allow_missing=True)
    if saved is None:
        yield
        return
    tvm_ffi.register_global_func(name, lambda: False, override=True)
    try:
        yield
    finally:
        tvm_ffi.register_global_func(name, saved, override=True)
