"""Compiling a model for the budget it will run with, from the store's records. Never tunes.

The fallback chain, always said aloud: records of the exact realised budget, else of the nearest
stored budget (ties go to the larger), and for kernels without records a default schedule: the best
by the budget's cost model among seeded samples of MetaSchedule's design space (parallel and
vectorised, unlike TVM's naive loops), or the first sample when no cost model is trained yet.
"""

from __future__ import annotations

import sys
import time

import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from resaware.budget import Budget, announce
from resaware.deploy.lowering import default_schedule, lower_as_tuned, records
from resaware.errors import ResawareError
from resaware.frontend import intrinsics
from resaware.frontend.model import resolve
from resaware.frontend.tasks import Task
from resaware.platform import confine, hardware
from resaware.runtime.compiled import CompiledModel
from resaware.store import Slot, Store, nearest, trained


def _say(message: str) -> None:
    print(f"resaware: {message}", file=sys.stderr)


def _provenance(model, slot: Slot | None, tasks: list[Task], stats: dict, untuned: list[Task], target,
                layout: str | None) -> dict:  # fmt: skip
    """The sidecar fields every compiled module carries: the model, where its records came from, its kernels."""
    return {
        "model": model.name,
        "model_digest": model.digest,
        "inputs": [s.to_json() for s in model.inputs],
        "outputs": model.outputs,
        "tuned_at": f"{slot.fraction:.0%}" if slot is not None else None,
        "tuned_slot": slot.key if slot is not None else None,
        "tuned_fraction": slot.fraction if slot is not None else None,
        "tuned_on": slot.hardware.id if slot is not None else None,
        "records": sum(s.trials for t in tasks if (s := stats.get(t.workload_hash))),
        "tvm_version": str(tvm.__version__),
        "target": hardware.target_json(target),
        "layout": layout,  # the convolutions' (None: the model has none)
        "tasks": len(tasks),
        "tuned_tasks": len(tasks) - len(untuned),
        "default_tasks": len(untuned),
    }


def compile(model, budget=1.0, store=None, target: str = "llvm", seed: int = 0, shapes=None,  # noqa: A001
            allow_mismatch: bool = False, arch: str | None = None, choose: str = "nearest",
            layout: str | None = None) -> CompiledModel:  # fmt: skip
    """Compile `model` for `budget` with the store's records; never tunes or measures. Records of
    other hardware are refused unless `allow_mismatch` (see `Store.slots_for`). `choose` picks the
    stored budget: "nearest" (the exact share, else the closest), or "predicted" (the one whose
    schedules the cost model predicts fastest at `budget`, `resaware.deploy.predict`; CPU budgets).

    `target="cuda"` builds with nvcc for the GPU here, else for `arch` (default sm_90), with no GPU needed.
    `layout` sets the convolutions' layout (default: the model's; auto: the one the records are of,
    see `lower_as_tuned`).
    """
    if choose not in ("nearest", "predicted"):
        raise ResawareError(f"choose {choose!r} is not a way to pick the stored budget: use nearest or predicted")
    if target == "cuda":
        if choose != "nearest":
            raise ResawareError("choose=predicted is for CPU budgets; CUDA compiles from the nearest MPS share")
        return _compile_cuda(
            resolve(model, shapes, layout), Budget.parse(budget), Store.open(store), arch, allow_mismatch
        )
    if target != "llvm":
        raise ResawareError(f"target {target!r} is not one resaware compiles for: use llvm (CPU) or cuda")
    from resaware.platform.cuda import check_target_arch

    check_target_arch(target, arch)
    started = time.monotonic()
    intrinsics.register("llvm")
    model = resolve(model, shapes, layout)
    budget = Budget.parse(budget)
    share = budget.cpu(confine.usable_cores())
    announce(share)
    tvm_target = hardware.llvm_target(share.count)
    hw = hardware.detect()
    store = Store.open(store)
    slots = store.slots_for(hw, "llvm", allow_mismatch)
    slot = nearest(slots, share.fraction)
    lowered, tasks, layout = lower_as_tuned(model, tvm_target, slot)
    why = ""
    if choose == "predicted" and slot is not None:
        from resaware.deploy.predict import estimate

        picked = estimate(model.name, budget, share.fraction, share.key, tasks, slots).choice
        if picked is None:
            _say("no cost model ranks the stored budgets' schedules yet (or none has every kernel); using the nearest")
        else:
            slot = next(s for s in slots if s.key == picked.key)  # it has records of every kernel in `tasks`
            why = f", predicted fastest here ({picked.predicted_s * 1e3:.3f} ms of kernels)"
    if slot is None:
        _say(f"warning: store {store.root} has no records for this hardware; every kernel gets a default schedule")
    elif slot.key == share.key:
        _say(f"compiling for {share.describe()} with records tuned at exactly that share ({slot.key}){why}")
    else:
        _say(f"compiling for {share.describe()} with records tuned at {slot.fraction:.0%} ({slot.key}), "
             f"{why[2:] if why else 'the nearest stored budget'}")  # fmt: skip
    tuned_db, stats, untuned = records(slot, tasks)
    defaults = ms.database.MemoryDatabase()
    if untuned:
        cost_model = slot.load_cost_model(1) if slot is not None and slot.cost_model_file.exists() else None
        for task in untuned:
            trace = default_schedule(task, tvm_target, cost_model, seed)
            if trace is None:
                continue
            workload = defaults.commit_workload(task.mod)
            defaults.commit_tuning_record(ms.database.TuningRecord(trace, workload, [1.0], tvm_target, None))
        how = (
            "the cost model's pick of seeded design-space samples"
            if trained(cost_model)
            else "a seeded design-space sample (no trained cost model)"
        )
        _say(f"warning: {len(untuned)} of {len(tasks)} kernels have no tuning records; they get {how}")
    database = ms.database.OrderedUnionDatabase(tuned_db, defaults)
    with tvm_target, database:
        scheduled = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(lowered)
    executable = tvm.compile(scheduled, target=tvm_target)
    info = {
        **_provenance(model, slot, tasks, stats, untuned, tvm_target, layout),
        "budget": str(budget),
        "realised": share.fraction,
        "cores": share.count,
        "chosen_by": choose,
        "hardware": hw.id,
        "compile_seconds": round(time.monotonic() - started, 2),
    }
    return CompiledModel(executable, info)


def _cuda_slots(store: Store, gpu, arch: str, allow_mismatch: bool) -> list[Slot]:
    """The CUDA budgets to compile from: this GPU's when building for it; else those measured on a GPU of
    `arch` with this TVM (the one with the most records, named when there are several)."""
    if gpu is not None and gpu.arch == arch:
        hw = hardware.Hardware.for_gpu(gpu.name, gpu.sms, gpu.arch, str(tvm.__version__))
        return store.slots_for(hw, "cuda", allow_mismatch)
    slots = [s for s in store.slots(kind="cuda") if s.hardware.gpu_arch == arch]
    if not allow_mismatch:
        slots = [s for s in slots if s.hardware.tvm_version == str(tvm.__version__)]
    gpus = sorted(
        {s.hardware.id for s in slots}, key=lambda h: -sum(len(s.database()) for s in slots if s.hardware.id == h)
    )
    if len(gpus) > 1:
        _say(f"warning: records of {len(gpus)} {arch} GPUs in the store; using {gpus[0]}'s, which has the most")
    return [s for s in slots if gpus and s.hardware.id == gpus[0]]


def _compile_cuda(model, budget: Budget, store: Store, arch: str | None, allow_mismatch: bool) -> CompiledModel:
    """The CUDA half of `compile`: records of the nearest MPS share, TVM's dlight defaults for the rest."""
    from resaware.platform import cuda

    started = time.monotonic()
    cuda.prepare_build()
    intrinsics.register("cuda")
    gpu = cuda.detect()
    tvm_target = cuda.target(arch)
    arch = str(tvm_target.attrs["arch"])
    fraction = budget.mps_percentage / 100
    if gpu is None:
        _say(f"no GPU here: building for {arch} with nvcc; run the module on a GPU of that architecture")
    where = f"the {gpu.name} here" if gpu else arch
    slot = nearest(_cuda_slots(store, gpu, arch, allow_mismatch), fraction)
    if slot is None:
        _say(
            f"warning: store {store.root} has no CUDA records for {arch}; every kernel gets TVM's default GPU schedule"
        )
    else:
        _say(f"compiling for {budget} of {where} with records measured at {slot.fraction:.0%} "
             f"({slot.key}) on {slot.hardware.describe()}")  # fmt: skip
    lowered, tasks, layout = lower_as_tuned(model, tvm_target, slot)
    database, stats, untuned = records(slot, tasks)
    if untuned:
        _say(f"warning: {len(untuned)} of {len(tasks)} kernels have no tuning records; they get TVM's dlight schedules")
    with tvm_target, database:
        scheduled = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(lowered)
    scheduled = cuda.default_schedules(scheduled, tvm_target)
    with tvm_target:  # TVM's nvcc callback reads the arch from the current target
        executable = tvm.compile(scheduled, target=tvm_target)
    info = {
        **_provenance(model, slot, tasks, stats, untuned, tvm_target, layout),
        "budget": str(budget), "realised": fraction, "target_kind": "cuda", "arch": arch,
        "gpu": gpu.name if gpu else None, "hardware": slot.hardware.id if slot is not None else None,
        "compile_seconds": round(time.monotonic() - started, 2),
    }  # fmt: skip
    return CompiledModel(executable, info)
