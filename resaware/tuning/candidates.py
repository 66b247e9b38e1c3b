"""Candidates built on one machine, measured on another, folded into the store.

    build(model, "cuda", DIR)        here, with the compiler (nvcc for CUDA; no GPU needed)
    measure_built DIR --budgets ...  there, with the TVM runtime alone (`resaware.runtime.measure_built`)
    fold(DIR, store)                 here or there: the timings become the budgets' records

DIR holds one shared library per candidate and `manifest.json`: the target, the tasks (weight, FLOPs,
workload), and per candidate its MetaSchedule trace and argument shapes. The candidates are samples
of MetaSchedule's design space for the target (its CUDA rules for `cuda`), the same for every budget,
so one measuring run times each at every budget. This is TVM RPC's split of host and device done in
one batch, for a GPU machine that is lent for minutes and a build machine that has no GPU.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from resaware.errors import ResawareError, last_line
from resaware.runtime.measure_built import MANIFEST, TIMINGS

_worker_kind: str | None = None


def _plain(value):
    """A TVM FFI value (Array, Map, String, numbers) as plain JSON-able Python, booleans as 0/1 as
    TVM's own JSON writer spells them (so traces compare equal to the store's)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (str, int, float)) or value is None:
        return value
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "__iter__"):
        return [_plain(v) for v in value]
    return str(value)


def _init_worker(kind: str) -> None:
    global _worker_kind
    _worker_kind = kind
    if kind == "cuda":
        from resaware.platform import cuda

        cuda.prepare_build()
    from resaware.frontend import intrinsics

    intrinsics.register(kind)


def _build_one(mod_json: str, target_json: str, path: str) -> str | None:
    """Compile one scheduled module and export it; the error text if it does not build."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    try:
        mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(tvm.ir.load_json(mod_json))
        target = tvm.target.Target(json.loads(target_json))
        with target:  # TVM's nvcc callback reads the arch from the current target
            tvm.compile(mod, target=target).export_library(path)
    except Exception as error:
        return last_line(error)
    return None


def sample(task, target, count: int, seed: int, database=None, cost_model=None) -> list:
    """`count` schedules of `task` (postprocessed, so each builds), as MeasureCandidates: random samples
    of MetaSchedule's design space, or, given a budget's `database` and trained `cost_model`, the picks
    of MetaSchedule's evolutionary search from them (as a tuner's next batch would be)."""
    from tvm.s_tir import meta_schedule as ms

    from resaware.platform import confine, quiet
    from resaware.store import trained
    from resaware.tuning.search import evolutionary

    guided = database is not None and trained(cost_model)
    strategy = evolutionary(count, lean=target.kind.name != "cuda") if guided else ms.search_strategy.ReplayTrace()
    context = ms.TuneContext(
        mod=task.mod, target=target, space_generator="post-order-apply", search_strategy=strategy,
        task_name=task.name, rand_state=seed, num_threads=len(confine.usable_cores()) if guided else 1,
    )  # fmt: skip
    with quiet.native_stderr():
        spaces = context.generate_design_space()
        if guided:
            context.pre_tuning(max_trials=count, num_trials_per_iter=count, design_spaces=spaces,
                               database=database, cost_model=cost_model)  # fmt: skip
        else:
            context.pre_tuning(max_trials=count, num_trials_per_iter=count, design_spaces=spaces)
        found = context.generate_measure_candidates() or []
    context.post_tuning()
    return found


def build(model, kind: str, directory: str | os.PathLike, per_task: int = 16, top: int | None = None,
          arch: str | None = None, seed: int = 0, workers: int | None = None, defaults: bool = False,
          guide=None) -> dict:  # fmt: skip
    """Sample `per_task` candidates of each of the `top` heaviest tasks of `model` (all by default) for
    `kind` (`cuda` or `llvm`), build each into `directory`, and write its manifest. With `defaults`
    (CUDA), each task's dlight default schedule is built too (`tK-default`, a baseline never folded).
    With `guide` (a store Slot with a trained cost model) the candidates are the evolutionary search's
    next picks for that budget instead of random samples."""
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.support.popen_pool import PopenPoolExecutor

    from resaware.frontend.model import resolve
    from resaware.frontend.tasks import extract
    from resaware.platform import confine, hardware

    if kind == "cuda":
        from resaware.frontend import intrinsics
        from resaware.platform import cuda

        cuda.prepare_build()
        intrinsics.register("cuda")
        target = cuda.target(arch)
    elif kind == "llvm":
        from resaware.frontend import intrinsics

        intrinsics.register("llvm")
        target = hardware.llvm_target(len(confine.usable_cores()))
    else:
        raise ResawareError(f"target {kind!r} is not one resaware builds for: give cuda or llvm")
    directory = Path(directory)
    if (directory / MANIFEST).exists():
        raise ResawareError(f"{directory} already holds candidates: give an empty or new directory")
    directory.mkdir(parents=True, exist_ok=True)
    model = resolve(model)
    tasks = extract(model, target)[:top]
    target_spec = _plain(target.export())
    target_json = json.dumps(target_spec)
    manifest = {
        "format": 1, "model": model.name, "kind": kind, "device": "cuda" if kind == "cuda" else "cpu",
        "target": target_spec, "target_json": hardware.target_json(target), "tvm_version": str(tvm.__version__),
        "tasks": [], "candidates": [],
    }  # fmt: skip
    jobs = []
    database = guide.database() if guide is not None else None
    cost_model = guide.load_cost_model(1) if guide is not None and guide.cost_model_file.exists() else None
    for ti, task in enumerate(tasks):
        manifest["tasks"].append({"name": task.name, "weight": task.weight, "flops": task.flops,
                                  "workload": tvm.ir.save_json(task.mod)})  # fmt: skip
        workload = ms.database.Workload(task.mod)
        for ci, candidate in enumerate(sample(task, target, per_task, seed + ti, database, cost_model)):
            cid = f"t{ti}-c{ci}"
            record = ms.database.TuningRecord(candidate.sch.trace, workload, None, target, candidate.args_info)
            manifest["candidates"].append({
                "id": cid, "task": ti, "file": f"{cid}.so", "record": _plain(record.as_json()),
                "args": [_plain(info.as_json()) for info in candidate.args_info],
            })  # fmt: skip
            jobs.append((tvm.ir.save_json(candidate.sch.mod), target_json, str(directory / f"{cid}.so")))
        if defaults and kind == "cuda":
            cid = f"t{ti}-default"
            manifest["candidates"].append({"id": cid, "task": ti, "file": f"{cid}.so", "record": None,
                                           "args": [_plain(a.as_json()) for a in ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])]})  # fmt: skip
            jobs.append(
                (tvm.ir.save_json(cuda.default_schedules(task.mod, target)), target_json, str(directory / f"{cid}.so"))
            )
    # TVM's pool starts fresh interpreters (TVM does not survive fork) without re-running __main__.
    pool = PopenPoolExecutor(max_workers=workers or len(confine.usable_cores()), timeout=300,
                             initializer=_init_worker, initargs=(kind,))  # fmt: skip
    try:
        futures = [pool.submit(_build_one, *job) for job in jobs]
        errors = []
        for future in futures:
            try:
                errors.append(future.result())
            except Exception as error:  # a worker that crashed or timed out fails its candidate
                errors.append(f"build failed: {str(error).strip()[:300]}")
    finally:
        pool.shutdown()
    failed = [(c, e) for c, e in zip(manifest["candidates"], errors) if e is not None]
    manifest["candidates"] = [c for c, e in zip(manifest["candidates"], errors) if e is None]
    manifest["build_failures"] = {c["id"]: e for c, e in failed}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if failed:
        print(f"resaware: {len(failed)} of {len(jobs)} candidates did not build (see {MANIFEST})", file=sys.stderr)
    return manifest


def _hardware(manifest: dict, timings: dict):
    """The store hardware the timings belong to: the GPU for CUDA, the measuring CPU otherwise."""
    from resaware.platform.hardware import Hardware

    machine = timings["hardware"]
    if manifest["kind"] == "cuda":
        return Hardware.for_gpu(machine["gpu_name"], machine["gpu_sms"], machine["gpu_arch"],
                                manifest["tvm_version"], machine.get("machine"))  # fmt: skip
    return Hardware(
        cpu_model=machine["cpu_model"], mcpu=manifest["target"].get("mcpu", "generic"),
        isa=tuple(machine.get("isa", ())), usable_cores=machine["usable_cores"],
        tvm_version=manifest["tvm_version"], machine=machine["machine"],
    )  # fmt: skip


def fold(directory: str | os.PathLike, store=None) -> dict[str, int]:
    """Add the measured candidates of `directory` to the store, one slot per budget measured (a
    candidate the slot already holds is skipped), retrain each budget's cost model; records added per budget."""
    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    from resaware.frontend.tasks import Task
    from resaware.store import FAILED, Store
    from resaware.store.exchange import known_candidates
    from resaware.store.records import RecordLine

    directory = Path(directory)
    if not (directory / TIMINGS).exists():
        raise ResawareError(
            f"{directory} has no {TIMINGS}: measure it first (python -m resaware.runtime.measure_built)"
        )
    manifest = json.loads((directory / MANIFEST).read_text())
    timings = json.loads((directory / TIMINGS).read_text())
    store = Store.open(store)
    hardware = _hardware(manifest, timings)
    mods = [tvm.ir.load_json(t["workload"]) for t in manifest["tasks"]]
    tasks = [Task(t["name"], t["weight"], t["flops"], mod) for t, mod in zip(manifest["tasks"], mods)]
    slots = {b: store.slot(hardware, manifest["kind"], e["key"], e["fraction"], manifest["target_json"])
             for b, e in timings["budgets"].items()}  # fmt: skip
    caches = timings.get("caches", "warm") if manifest["kind"] == "llvm" else None  # CPU timings before were warm
    for slot in slots.values() if caches else ():  # every budget before any is written: all or none
        slot.refuse_other_caches(caches, "these candidates")
    added = {}
    for budget, entry in timings["budgets"].items():
        slot = slots[budget]
        with slot.locked():  # one writer per budget: folding while a tuner writes it is refused in one line
            if caches:
                slot.refuse_other_caches(caches, "these candidates")  # again: a tuner may have begun since
                slot.time_as(caches)
            slot.commit_workloads(mods)
            database = slot.shared_database()
            workloads = [database.commit_workload(mod) for mod in mods]
            hashes = [int(tvm_ffi.structural_hash(mod)) for mod in mods]
            with slot.records_locked():
                _, existing = known_candidates(slot)
            seen = {candidate for candidate, _ in existing}
            count = 0
            for candidate in manifest["candidates"]:
                result = entry["results"].get(candidate["id"])
                if result is None or candidate["record"] is None:
                    continue
                record = ms.database.TuningRecord.from_json(candidate["record"], workloads[candidate["task"]])
                identity = (hashes[candidate["task"]], RecordLine(candidate["task"], candidate["record"]).trace)
                if identity in seen:
                    continue
                seen.add(identity)
                secs = result.get("secs") or [FAILED]
                database.commit_tuning_record(
                    ms.database.TuningRecord(record.trace, record.workload, secs, record.target, record.args_info)
                )
                count += 1
            slot.remember_tasks(tasks, manifest["model"])
            if count:
                slot.rebuild_cost_model()
        added[budget] = count
    return added


def _own_slot(store, kind: str, budget, arch: str | None):
    """The slot this machine's measurements of `budget` go to, if the store has it already."""
    from resaware.platform import confine, hardware

    if kind == "cuda":
        import tvm

        from resaware.platform import cuda

        gpu = cuda.detect()
        if gpu is None or (arch is not None and cuda.check_arch(arch) != gpu.arch):
            return None
        hw = hardware.Hardware.for_gpu(gpu.name, gpu.sms, gpu.arch, str(tvm.__version__))
        keys = {f"mps-{budget.mps_percentage}"} | ({"gpu-100"} if budget.fraction == 1.0 else set())
    else:
        hw, keys = hardware.detect(), {budget.cpu(confine.usable_cores()).key}
    return next((s for s in store.slots(hw, kind) if s.key in keys), None)


def tune(model, kind: str, budgets, trials: int, store=None, per_round: int = 8, arch: str | None = None,
         seed: int = 0, sharing: str = "auto") -> dict[str, int]:  # fmt: skip
    """Tune on this machine by rounds of build, measure (with the runtime alone, in a child per budget)
    and fold, until each budget holds `trials` records of `model`'s tasks. Rounds follow the evolutionary
    search of the budget's cost model once it is trained (a rerun continues from it); before that they
    sample at random. This is how CUDA budgets tune where the GPU is; split across machines it is
    `candidates build/measure/fold`. Returns the records of the model's tasks each budget holds."""
    import shutil
    import tempfile

    from resaware.budget import Budget
    from resaware.frontend.model import resolve
    from resaware.runtime.measure_built import measure
    from resaware.store import Store

    model = resolve(model)
    store = Store.open(store)
    budgets = [Budget.parse(b) for b in budgets]
    if not budgets:
        raise ResawareError("no budget given: e.g. --budgets 25%,100%")
    held = {}
    for budget in budgets:
        slot = _own_slot(store, kind, budget, arch)
        hashes = None  # the model's workloads, known after the first build
        for round_ in range(1, trials + 2):
            count = _model_records(slot, hashes)
            if count >= trials:
                break
            work = Path(tempfile.mkdtemp(prefix="resaware-round-"))
            try:
                manifest = build(model, kind, work / "c", per_task=per_round, arch=arch,
                                 seed=seed + 1000 * round_, guide=slot)  # fmt: skip
                timings = measure(work / "c", [budget], sharing=sharing)
                if str(budget) not in timings["budgets"]:
                    raise ResawareError(f"budget {budget} could not be measured here (see the lines above)")
                entry = timings["budgets"][str(budget)]
                added = fold(work / "c", store)[str(budget)]
            finally:
                shutil.rmtree(work, ignore_errors=True)
            hashes = {_workload_hash(t["workload"]) for t in manifest["tasks"]}
            slot = store.slot(
                _hardware(manifest, timings), kind, entry["key"], entry["fraction"], manifest["target_json"]
            )
            print(f"resaware: {budget} round {round_}: +{added} records ({_model_records(slot, hashes)} of {trials})",
                  file=sys.stderr)  # fmt: skip
            if added == 0:  # the search has nothing new to offer
                break
        held[str(budget)] = _model_records(slot, hashes)
    return held


def _workload_hash(workload_json: str) -> int:
    import tvm
    import tvm_ffi

    return int(tvm_ffi.structural_hash(tvm.ir.load_json(workload_json)))


def _model_records(slot, hashes: set[int] | None) -> int:
    """Records `slot` holds of these workloads (all of its records while they are not known yet)."""
    if slot is None:
        return 0
    stats = slot.stats()
    return sum(s.trials for h, s in stats.items() if hashes is None or h in hashes)
