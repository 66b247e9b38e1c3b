"""A model's tuning tasks: the fused kernels MetaSchedule extracts, with weights and FLOP counts."""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from resaware.budget import Budget
from resaware.errors import ResawareError
from resaware.frontend import intrinsics, winograd
from resaware.frontend.layout import convert, unconverted
from resaware.frontend.layout import resolve as resolve_layout
from resaware.frontend.model import Model, resolve
from resaware.platform import confine, hardware


@dataclass(frozen=True)
class Task:
    """One kernel to tune: `weight` is how often the model calls it, `flops` per call."""

    name: str
    weight: int
    flops: float
    mod: tvm.IRModule  # the workload MetaSchedule keys records by

    @property
    def workload_hash(self) -> int:
        """The structural hash MetaSchedule keys this kernel's records by."""
        return int(tvm_ffi.structural_hash(self.mod))


def lower(model: Model, target, layout: str | None = None) -> tuple[tvm.IRModule, str | None]:
    """The Relax pipeline up to tuning (as TVM's static_shape_tuning_pipeline runs it), with the
    convolutions in `layout` (default: the model's; `resaware.frontend.layout`), and the layout they are in
    (None: the model has none).

    Without legalisation and fusion there are no TIR kernels, so nothing to extract or tune.
    """
    mod, layout = convert(model.mod, resolve_layout(layout or model.layout, target))

    def passes(layout):
        return tvm.transform.Sequential(
            [
                relax.transform.DecomposeOpsForInference(),
                relax.transform.CanonicalizeBindings(),
                *([winograd.legalize()] if layout == "NHWC-winograd" else []),
                relax.get_pipeline("zero"),
            ]
        )

    with target:
        try:
            lowered = passes(layout)(mod)
        except Exception as error:
            if layout not in ("NHWC", "NHWC-winograd"):
                raise
            unconverted(error)  # a pass that cannot handle the converted module: lower it as imported
            return passes("NCHW")(model.mod), "NCHW"
    if layout == "NHWC-winograd" and not any("winograd" in gv.name_hint for gv in lowered.functions):
        layout = "NHWC"  # no convolution Winograd computes: the kernels are NHWC's
    return lowered, layout


def _flops(mod: tvm.IRModule) -> float:
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(mod))
    except Exception:  # some kernels (e.g. with data-dependent loops) have no static count
        return 0.0


def extract(model: Model, target, lowered: tvm.IRModule | None = None) -> list[Task]:
    """The model's tasks for `target`, heaviest (weight x FLOPs) first."""
    lowered = lowered if lowered is not None else lower(model, target)[0]
    found = ms.relax_integration.extract_tasks(lowered, target)
    tasks = [Task(t.task_name, int(t.weight), _flops(t.dispatched[0]), t.dispatched[0]) for t in found]
    return sorted(tasks, key=lambda t: (-t.weight * t.flops, t.name))


def of(model, budget="100%", target: str = "llvm", arch: str | None = None) -> list[Task]:
    """The tasks of `model` (a Model, path or `zoo:` name) for the LLVM target of a CPU budget on this
    machine, or for CUDA (`target="cuda"`: this GPU's arch, else `arch` or sm_90; no GPU needed)."""
    if target == "cuda":
        from resaware.platform import cuda

        cuda.prepare_build()
        intrinsics.register("cuda")
        return extract(resolve(model), cuda.target(arch))
    if target != "llvm":
        raise ResawareError(f"target {target!r} is not one resaware tunes for: use llvm (CPU) or cuda")
    intrinsics.register("llvm")  # else the first extraction imports every backend's tensor intrinsics
    share = Budget.parse(budget).cpu(confine.usable_cores())
    return extract(resolve(model), hardware.llvm_target(share.count))


def table(tasks: list[Task]) -> str:
    """A printable listing of tasks."""
    total = sum(t.weight * t.flops for t in tasks) or 1.0
    rows = [f"{'#':>3}  {'task':<44} {'weight':>6} {'MFLOP':>10} {'share':>6}"]
    for i, t in enumerate(tasks):
        rows.append(
            f"{i:>3}  {t.name[:44]:<44} {t.weight:>6} {t.flops / 1e6:>10.2f} {t.weight * t.flops / total:>6.1%}"
        )
    rows.append(f"{len(tasks)} tasks, {total / 1e9:.3f} GFLOP per inference")
    return "\n".join(rows)
