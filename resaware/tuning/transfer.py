"""Warm start (`tune(..., warm_start=True)`): a new budget begins from what the nearest tuned budget learnt.

A budget's best schedules are usually good at its neighbours (the cross-budget matrices), so a budget
with no records of its own starts with
- a cost model trained on the nearest budget's records, kept in groups of their own so that each
  budget's costs are normalised among themselves, and trained on with its own records as they come;
- that budget's best schedules in the evolutionary search's initial population (MetaSchedule takes a
  share of it from the database's best records) while its own database holds too few of them;
- a small first batch per task: the donor's picks need confirming, not a broad random sample.

benchmarks/transfer.py measures it: fewer trials to a cold start's quality in three of four directions
on this CPU, and a search that stalls near a weak donor's schedules in the fourth; hence opt-in.
"""

from __future__ import annotations

from resaware.store import DONOR_MARK, Slot, Store, fit, nearest, top_records

FIRST_BATCH = 4  # candidates per task in a warm-started budget's first round


def donor(slot: Slot, store: Store, workloads: set[int]) -> Slot | None:
    """The budget of the same hardware and target kind nearest to `slot`'s (as compiling chooses) that
    tuned any of `workloads` (structural hashes), its records timed as `slot`'s are (`Slot.time_as`), or None."""
    others = [
        s for s in store.slots(slot.hardware, slot.kind)
        if s.path != slot.path and s.fraction != slot.fraction and s.has_records
        and s.caches() == slot.info.get("caches") and workloads & {int(h) for h in s.task_names()}
    ]  # fmt: skip
    return nearest(others, slot.fraction)


def begin(
    slot: Slot, store: Store, workloads: set[int], fresh: bool, threads: int = 1
) -> tuple[Slot | None, int | None]:
    """Whether and how tuning `workloads` at `slot` starts warm: (the donor budget, the first round's
    candidates per task), or (None, None).

    A budget without a cost model gets one trained on the nearest budget's records of these workloads;
    a budget that got one so before keeps that donor's schedules in its search's initial population;
    one tuned cold stays cold. The small first round is for `fresh` budgets (no records of these tasks)."""
    nearby = donor(slot, store, workloads)
    if nearby is None:
        return None, None
    if slot.cost_model_file.exists():
        mark = f"{DONOR_MARK}{nearby.key}"
        return (nearby if any(k.endswith(mark) for k in slot.load_cost_model(1).data) else None), None
    if not seed_cost_model(slot, nearby, workloads, threads):
        return None, None
    return nearby, (FIRST_BATCH if fresh else None)


def seed_cost_model(slot: Slot, donor: Slot, workloads: set[int] | None = None, threads: int = 1) -> int:
    """Train `slot`'s cost model on `donor`'s records (of the `workloads`, by structural hash, if given)
    as groups of their own; return how many records it learnt from."""
    import tvm_ffi

    model = slot.load_cost_model(threads)
    before = model.data_size
    records = [
        r for r in donor.database().get_all_tuning_records()
        if workloads is None or int(tvm_ffi.structural_hash(r.workload.mod)) in workloads
    ]  # fmt: skip
    fit(model, records, slot.kind, threads, group=f"{DONOR_MARK}{donor.key}")
    slot.save_cost_model(model)
    return model.data_size - before


def shared_database(slot: Slot, donor: Slot | None):
    """`slot`'s database for a tuner appending to it, with `donor`'s best schedules filling the initial
    population where `slot` has too few (no donor: `slot`'s own only)."""
    return slot.shared_database(Donor(donor) if donor is not None else None)


class Donor:
    """Another budget's best schedules, for the initial population of a budget that has few of its own."""

    def __init__(self, slot: Slot):
        self.slot = slot
        self.database = slot.database()

    def top_k(self, mod, count: int) -> list:
        """The donor's `count` best records of the workload `mod` (none if it never tuned it)."""
        return top_records(self.database, mod, count)


def pairwise(scores, costs) -> tuple[int, int]:
    """(pairs a cost model's `scores` order as the measured `costs` do, pairs compared): higher score
    means faster; failed candidates (cost None) and equal costs are left out."""
    points = [(s, c) for s, c in zip(scores, costs) if c is not None]
    right = total = 0
    for i, (si, ci) in enumerate(points):
        for sj, cj in points[i + 1 :]:
            if ci == cj:
                continue
            total += 1
            right += int(si != sj and (si > sj) == (ci < cj))
    return right, total
