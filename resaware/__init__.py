"""resaware: tune models with TVM MetaSchedule for the share of a device they will run on."""

import os

# TVM's thread pool pins its threads to cores unless told not to, which can move a caller off the
# cores it confined itself to. Must be set before TVM's runtime starts its pool.
os.environ.setdefault("TVM_BIND_THREADS", "0")

from .budget import Budget, BudgetError  # noqa: E402
from .errors import ResawareError  # noqa: E402

__all__ = ["Budget", "BudgetError", "ResawareError", "load_onnx", "tune", "compile", "load", "zoo", "bench", "Store"]
__version__ = "0.1.0"


def __getattr__(name):
    # Heavy parts (the TVM compiler) load on first use, so `resaware.load` works with the runtime alone.
    if name == "load_onnx":
        from .model import load_onnx

        return load_onnx
    if name == "tune":
        from .tuning import tune

        return tune
    if name == "compile":
        from .compiling import compile

        return compile
    if name == "load":
        from .compiled import load

        return load
    if name == "Store":
        from .store import Store

        return Store
    if name in ("zoo", "bench"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'resaware' has no attribute {name!r}")
