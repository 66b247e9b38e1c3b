"""Lowering a model for a target as a slot's records were tuned, and schedules for kernels without records."""

from __future__ import annotations

import sys

from tvm.s_tir import meta_schedule as ms

from resaware.frontend.tasks import Task, extract, lower
from resaware.platform import quiet
from resaware.store import Slot, trained


def _say(message: str) -> None:
    print(f"resaware: {message}", file=sys.stderr)


def default_schedule(task: Task, target, cost_model, seed: int, samples: int = 16):
    """A measured-nothing, deterministic schedule for `task` (a MetaSchedule trace)."""
    context = ms.TuneContext(
        mod=task.mod,
        target=target,
        space_generator="post-order-apply",
        search_strategy=ms.search_strategy.ReplayTrace(),
        task_name=task.name,
        rand_state=seed,
        num_threads=1,
    )
    with quiet.native_stderr():
        spaces = context.generate_design_space()
    context.pre_tuning(max_trials=samples, num_trials_per_iter=samples, design_spaces=spaces)
    candidates = context.generate_measure_candidates() or []
    context.post_tuning()
    if not candidates:
        return None
    if trained(cost_model):
        scores = cost_model.predict(context, candidates)
        best = max(range(len(candidates)), key=lambda i: (float(scores[i]), -i))
        return candidates[best].sch.trace
    return candidates[0].sch.trace


def lower_as_tuned(model, target, slot: Slot | None):
    """The model lowered for `target`, its tasks, and their layout (`tasks.lower`). On CPU a model whose
    layout is `auto` (NHWC there) is lowered as imported too when the slot lacks records of some NHWC
    kernels (and in NHWC-winograd when the slot holds Winograd kernels), and takes whichever lowering's
    kernels the slot's records cover most FLOPs of: so a store tuned in another layout (or before NHWC
    became the CPU default) still compiles from its records."""
    lowered, layout = lower(model, target)
    tasks = extract(model, target, lowered)
    if model.layout != "auto" or slot is None or layout != "NHWC":
        return lowered, tasks, layout
    stats = slot.stats()

    def covered(tasks) -> float:
        return sum(t.weight * t.flops for t in tasks if has_record(stats, t))

    if all(has_record(stats, t) for t in tasks):
        return lowered, tasks, layout
    best = (covered(tasks), lowered, tasks, layout)
    # Lowering in Winograd builds every weight transform: only worth it if the slot has such kernels.
    winograd = any("winograd" in entry.get("name", "") for entry in slot.task_names().values())
    for other in ["NHWC-winograd", "NCHW"] if winograd else ["NCHW"]:
        mod, really = lower(model, target, other)
        if really != other:
            continue
        other_tasks = extract(model, target, mod)
        if (amount := covered(other_tasks)) > best[0]:
            best = (amount, mod, other_tasks, other)
    if best[3] != layout:
        _say(f"the store's records are of {best[3]} convolutions (auto is NHWC on CPU): compiling in {best[3]}")
    return best[1:]


def records(slot: Slot | None, tasks: list[Task]):
    """The slot's database (empty without a slot), its per-workload stats, and the tasks it has no valid record of."""
    database = slot.database() if slot is not None else ms.database.MemoryDatabase()
    stats = slot.stats(database) if slot is not None else {}
    untuned = [t for t in tasks if not has_record(stats, t)]
    return database, stats, untuned


def has_record(stats: dict, task: Task) -> bool:
    """Whether `stats` (a slot's, by workload) hold a valid record of `task`."""
    return (s := stats.get(task.workload_hash)) is not None and s.best_s is not None
