"""resaware: tune models with TVM MetaSchedule for the share of a device they will run on.

A budget is a share of one device: "50%" is half of this machine's usable cores, pinned. resaware tunes
each kernel of an ONNX model in a process confined to its budget, keeps the records and an XGBoost cost
model per budget in a store keyed by hardware, and compiles for the budget the model will run with,
from those records, without tuning at deploy time.

    import resaware

    model = resaware.load_onnx("zoo:squeezenet")          # an .onnx path, a ModelProto or zoo:NAME
    report = resaware.tune(model, ["50%", "100%"], trials=256, store="./store")
    print(report.table())
    compiled = resaware.compile(model, budget="50%", store="./store")
    (out,) = compiled(*model.random_inputs(0))              # NumPy in, NumPy out
    print(compiled.benchmark(budget="50%"))                 # timed in a process confined to 50%
    compiled.export("squeezenet-50.so")                     # resaware.load() it anywhere identical

    matrix = resaware.bench.cross_budget(model, ["50%", "100%"], ["50%", "100%"], 256, store="./store")
    resaware.plot.heatmap(matrix, "matrix.png")

The heavy parts load on first use, so `resaware.load` needs only the TVM runtime. The packages, from
the bottom up (each imports only those below it; tests/test_architecture.py holds them to it):
`platform` (hardware, confinement, CUDA/MPS, doctor), `runtime` (what runs with the TVM runtime alone),
`frontend` (ONNX import, zoo, layout, Winograd, tasks, plans), `store` (records, cost models, exchange),
`tuning` (measuring, search, clients, RPC, warm start, GPU candidates), `deploy` (compile, predict),
`analysis` (bench, reference, plots) and `cli`. GPU budgets are MPS shares: kernels built here with
nvcc (`tuning.candidates`, no GPU needed), measured on the GPU by `runtime.measure_built` with the TVM
runtime alone, folded into the store.
"""

import os

# TVM's thread pool pins its threads to cores unless told not to, which can move a caller off the
# cores it confined itself to. Must be set before TVM's runtime starts its pool.
os.environ.setdefault("TVM_BIND_THREADS", "0")

from resaware.budget import Budget, BudgetError  # noqa: E402
from resaware.errors import ResawareError  # noqa: E402

__all__ = ["Budget", "BudgetError", "ResawareError", "load_onnx", "tune", "compile", "load", "Store", "bench", "plot",
           "tasks", "zoo"]  # fmt: skip
__version__ = "0.1.0"
# Modules of the public API, by the short names users know them by.
_SUBMODULES = {"bench": "resaware.analysis.bench", "plot": "resaware.analysis.plot", "tasks": "resaware.frontend.tasks",
               "zoo": "resaware.frontend.zoo"}  # fmt: skip


def __getattr__(name):
    """The API's heavy parts (the TVM compiler) load on first use: `resaware.load` needs only the runtime."""
    if name == "load_onnx":
        from resaware.frontend.model import load_onnx

        return load_onnx
    if name == "tune":
        from resaware.tuning.tune import tune

        return tune
    if name == "compile":
        from resaware.deploy.compiling import compile

        return compile
    if name == "load":
        from resaware.runtime.compiled import load

        return load
    if name == "Store":
        from resaware.store import Store

        return Store
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'resaware' has no attribute {name!r}")


def __dir__():
    """Every name, those loaded on first use included (for pydoc and completion)."""
    return sorted(set(globals()) | set(__all__))
