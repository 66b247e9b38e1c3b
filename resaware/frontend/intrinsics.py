"""Register only the tensor intrinsics a target family can use.

MetaSchedule imports `tvm.s_tir.tensor_intrin` whenever a tuning context is made, and that package
parses the intrinsics of every backend (CUDA, ROCm, Hexagon, ...): ~40 s on a small machine, paid by
every tuning or compiling process. A CPU target needs only its own family's. Installing the package
as an empty namespace first keeps its submodules importable one by one.
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
import sys
import types

_PACKAGE = "tvm.s_tir.tensor_intrin"


def register(kind: str = "llvm") -> None:
    """Make `tvm.s_tir.tensor_intrin` cheap to import, with the intrinsics `kind` may tensorise with, and
    register resaware's own schedule rules for it (`resaware.frontend.winograd`'s on CPU)."""
    if _PACKAGE not in sys.modules:
        spec = importlib.util.find_spec(_PACKAGE)
        package = types.ModuleType(_PACKAGE, "Tensor intrinsics, registered per target family by resaware.")
        package.__path__ = list(spec.submodule_search_locations)
        package.__package__ = _PACKAGE
        sys.modules[_PACKAGE] = package
    if kind == "cuda":
        families = ["cuda"]
    elif platform.machine() in ("aarch64", "arm64"):
        families = ["arm_cpu"]
    elif platform.machine().startswith("riscv"):
        families = ["riscv_cpu"]
    else:
        families = ["x86"]
    for family in families:
        importlib.import_module(f"{_PACKAGE}.{family}")
    if kind != "cuda":
        from resaware.frontend import winograd  # noqa: F401  (registers its MetaSchedule rule)
