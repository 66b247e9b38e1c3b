"""A budget's XGBoost cost model (MetaSchedule's XGBModel): trained on records, loaded, saved, merged.

`XGBModel.save` writes its booster and the features and costs it trained on; a cost model never
holds anything its budget's records do not, except groups another budget lent it (`DONOR_MARK`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm_ffi

from resaware import files
from resaware.platform import quiet
from resaware.store.records import FAILED, replay

DONOR_MARK = "@"  # in a cost model's group key: data from another budget's records (`resaware.tuning.transfer`)


@dataclass(frozen=True)
class Validated:
    """A cost model's record on batches it had not trained on (`Slot.validation`)."""

    pairwise: float  # share of candidate pairs it ordered as they measured (0.5: no better than a coin)
    rmse: float  # mean RMSE of its predicted normalised throughput (best so far / cost, 1 = as fast)
    batches: int
    samples: int  # what it was last trained on


def fresh(threads: int):
    """An untrained cost model."""
    from tvm.s_tir.meta_schedule.cost_model import XGBModel

    return XGBModel(num_tuning_cores=threads, adaptive_training=True)


def trained(cost_model) -> bool:
    """Whether an XGBoost cost model has been trained (an untrained one ranks at random)."""
    return cost_model is not None and getattr(cost_model, "booster", None) is not None


def ranks(cost_model) -> bool:
    """Whether an XGBoost cost model ranks by what it learnt: trained, and past the samples below which
    MetaSchedule's XGBModel predicts at random."""
    return trained(cost_model) and cost_model.data_size >= cost_model.num_warmup_samples


def load(path: Path, threads: int):
    """The cost model at `path` with the data it was trained on; fresh if there is none. A file that
    does not load is set aside as `<name>.corrupt-<time>` (its donor groups and data are not lost to the
    next save) and a fresh model is returned, with a warning."""
    model = fresh(threads)
    if not path.exists():
        return model
    try:
        with quiet.xgboost_warnings():
            model.load(str(path))
        return model
    except Exception as error:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        path.replace(aside)
        print(f"resaware: warning: cost model {path} does not load ({str(error).strip().splitlines()[-1]}); "
              f"set aside as {aside.name}, starting a fresh one", file=sys.stderr)  # fmt: skip
        return fresh(threads)


def save(model, path: Path) -> None:
    """Replace the cost model file `path` atomically; a model never trained writes nothing (its data is
    in the records anyway)."""
    if not trained(model):
        return
    with files.replacing(path) as tmp, quiet.xgboost_warnings():
        model.save(str(tmp))


def retrain(model) -> None:
    """Train the booster anew on all of the model's data, as XGBModel's own update does after appending."""
    with np.errstate(divide="ignore", invalid="ignore"):
        features = [f for g in model.data.values() for f in g.features]
        ratios = [np.divide(g.min_cost, g.costs, out=np.zeros_like(g.costs), where=g.costs != 0) for g in model.data.values()]  # fmt: skip
    if not features:
        return
    with quiet.xgboost_warnings():
        model._train(xs=features, ys=np.concatenate(ratios, axis=0))  # XGBModel has no public "train on your data"
    model.last_train_size = model.data_size


def merge(base, parts: list) -> None:
    """Fold into `base` cost models that concurrent clients trained from it on disjoint tasks: the largest
    feature group per workload is the union. The booster is then retrained on the merged data, so it
    ranks every shard's tasks, not only one client's."""
    for model in parts:
        for key, group in model.data.items():
            if key not in base.data or len(group.costs) > len(base.data[key].costs):
                base.data[key] = group
    base.data_size = sum(len(g.costs) for g in base.data.values())
    retrain(base)


def fit(model, records, kind: str, threads: int = 1, group: str = "") -> None:
    """Train an XGBoost cost model on tuning records (their traces replayed for features, their timings
    as costs), one group per workload; `group` is appended to each group's key, so data from another
    budget is normalised among itself rather than against this budget's costs."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.utils import shash2hex

    from resaware.frontend import intrinsics

    intrinsics.register(kind)  # else the first TuneContext imports every backend's intrinsics
    by_workload: dict[int, list] = {}
    for record in records:
        by_workload.setdefault(int(tvm_ffi.structural_hash(record.workload.mod)), []).append(record)
    groups = []
    for same in by_workload.values():
        mod = same[0].workload.mod
        context = ms.TuneContext(mod=mod, target=same[0].target, num_threads=threads)
        candidates, results = [], []
        for record in same:
            if (candidate := replay(record, mod)) is not None:  # a trace that no longer replays teaches nothing
                candidates.append(candidate)
                results.append(ms.runner.RunnerResult([float(s) for s in record.run_secs or [FAILED]], None))
        if candidates:
            groups.append((context, candidates, results))
    adaptive = model.adaptive_training
    for i, (context, candidates, results) in enumerate(groups):
        key = shash2hex(context.mod)
        own = None
        if group:  # XGBModel appends to the group keyed by the workload: put this group's data there
            own = model.data.pop(key, None)
            if (earlier := model.data.pop(key + group, None)) is not None:
                model.data[key] = earlier
        model.adaptive_training = adaptive and i < len(groups) - 1  # the last update trains on everything
        try:
            with quiet.xgboost_warnings():
                model.update(context, candidates, results)
        finally:
            model.adaptive_training = adaptive
            if group:
                if (moved := model.data.pop(key, None)) is not None:
                    moved.group_hash = key + group  # what `save` writes and `load` keys by
                    model.data[key + group] = moved
                if own is not None:
                    model.data[key] = own
