"""A slot: one (hardware, target kind, realised budget) corner of the store, as a directory.

    budget.json                     the realised budget (fraction, key, kind, target; how CPU records were timed)
    database_workload.json          MetaSchedule's workloads (one kernel a line)
    database_tuning_record.json     MetaSchedule's records (one measured candidate a line)
    cost_model.tar                  XGBoost, with its data
    cost_model_validation.jsonl     its ranking of each new batch
    tasks.json                      names, FLOPs and weights of the workloads

MetaSchedule's lookup ignores the target, so each budget has a database of its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from resaware import files
from resaware.errors import ResawareError
from resaware.files import read_json, write_json
from resaware.platform.hardware import Hardware
from resaware.store import cost_model, records
from resaware.store.cost_model import DONOR_MARK, Validated
from resaware.store.records import SharedAppends, WorkloadStats, mean_seconds, workload_stats


class Slot:
    """One (hardware, target kind, realised budget) corner of the store."""

    def __init__(self, path: Path, hardware: Hardware, kind: str, key: str, info: dict):
        self.path, self.hardware, self.kind, self.key, self.info = path, hardware, kind, key, info

    @property
    def fraction(self) -> float:
        """The budget's realised fraction of the device."""
        return float(self.info["fraction"])

    @property
    def workload_file(self) -> Path:
        """MetaSchedule's workload file (one kernel a line)."""
        return self.path / "database_workload.json"

    @property
    def record_file(self) -> Path:
        """MetaSchedule's tuning-record file (one measured candidate a line)."""
        return self.path / "database_tuning_record.json"

    @property
    def cost_model_file(self) -> Path:
        """The budget's XGBoost cost model with its training data."""
        return self.path / "cost_model.tar"

    @classmethod
    def open(cls, path: str | os.PathLike) -> Slot:
        """The slot at `path` (a budget directory inside a store)."""
        path = Path(path)
        info = read_json(path / "budget.json")
        if info is None:
            raise ResawareError(f"{path} is not a budget directory of a resaware store (no budget.json)")
        return cls(
            path, Hardware.from_json(read_json(path.parent.parent / "hardware.json")), info["kind"], info["key"], info
        )

    @property
    def records_lock_file(self) -> Path:
        """The lock every appender of this budget's records holds."""
        return self.path / ".records.lock"

    def records_locked(self):
        """Hold the lock every append to this budget's database takes (see `SharedAppends`); re-entrant."""
        return files.locked(self.records_lock_file)

    def database(self):
        """The MetaSchedule JSON database of this budget (created empty if missing), for reading.
        Lines that cannot load are set aside first (`repair`)."""
        self.path.mkdir(parents=True, exist_ok=True)
        with self.records_locked():
            return records.open_database(self.workload_file, self.record_file)

    def repair(self) -> int:
        """Set aside the lines of this budget's database that cannot load (cut short by a killed
        process, or damaged by hand) into `<file>.corrupt`, warning with file and line; return how many."""
        with self.records_locked():
            return records.repair(self.workload_file, self.record_file)

    def commit_workloads(self, mods) -> None:
        """Write these workloads into the database now, before any tuner appends records (see `SharedAppends`)."""
        self.path.mkdir(parents=True, exist_ok=True)
        with self.records_locked():
            database = records.open_database(self.workload_file, self.record_file)
            for mod in mods:
                database.commit_workload(mod)

    def shared_database(self, donor=None) -> SharedAppends:
        """This budget's database for a tuner appending to it, maybe beside others (see `SharedAppends`);
        a `donor` (`top_k(mod, count)`: another budget's best records) fills in where this one has too few."""
        self.repair()
        return SharedAppends(str(self.workload_file), str(self.record_file), str(self.records_lock_file), donor)

    def caches(self) -> str | None:
        """How this budget's CPU records were timed, "flushed" or "warm" (`measure.Timing`); None while
        it holds none. Records from before resaware wrote this down were timed warm."""
        if not self.has_records:
            return None
        return read_json(self.path / "budget.json", self.info).get("caches", "warm")

    def time_as(self, caches: str) -> str:
        """Fix how this budget's records are timed, so that every record ranks against records timed
        alike: as those it holds were (`caches()`), else `caches`. Returns which; hold `locked()`."""
        held = self.caches() or caches
        info = read_json(self.path / "budget.json", self.info)
        if info.get("caches") != held:
            write_json(self.path / "budget.json", {**info, "caches": held})
        self.info = {**info, "caches": held}
        return held

    def refuse_other_caches(self, caches: str, what: str) -> None:
        """One clear line if this budget's records were timed otherwise than `caches` (those of `what`)."""
        held = self.caches()
        if held not in (None, caches):
            raise ResawareError(f"the {self.key} records in {self.path.parent.parent.parent} were timed {held}, "
                                f"{what} {caches}: they would not rank alike; keep them in another store")  # fmt: skip

    def stats(self, database=None) -> dict[int, WorkloadStats]:
        """Trials and best latency per workload (keyed by structural hash)."""
        if not self.record_file.exists():
            return {}
        return workload_stats(database if database is not None else self.database())

    def curve(self, model: str | None = None) -> list[tuple[int, float | None]]:
        """A tuning curve of `model` (by default, the only model this budget's tasks belong to), read from the
        database in the order records were measured: after each record of its tasks, (its records so far,
        sum of weight x best mean seconds once every task has a valid record, else None)."""
        tasks = self.task_names()
        models = sorted({m for entry in tasks.values() for m in entry["models"]})
        if model is None and len(models) > 1:
            raise ResawareError(f"{self.path} holds tasks of {', '.join(models)}: say which model's curve to draw")
        model = model or (models[0] if models else None)
        weights = {int(h): entry["models"][model] for h, entry in tasks.items() if model in entry["models"]}
        hashes = records.workload_hashes(self.workload_file)
        best: dict[int, float] = {}
        points: list[tuple[int, float | None]] = []
        for _, line, _ in records.lines(self.record_file):
            try:
                record = records.parse_record(line)
                key, mean = hashes[record.workload], mean_seconds(record.run_secs)
            except (ValueError, IndexError, TypeError):
                continue  # damaged: set aside on open, and no measurement
            if key not in weights:
                continue
            if mean is not None:
                best[key] = min(best.get(key, mean), mean)
            estimate = sum(w * best[k] for k, w in weights.items()) if len(best) == len(weights) else None
            points.append((len(points) + 1, estimate))
        return points

    def task_names(self) -> dict[str, dict]:
        """Workload hash -> name, FLOPs and weight per model, of every task tuned here."""
        return read_json(self.path / "tasks.json", {})

    def remember_tasks(self, tasks, model_name: str, complete: bool = False) -> None:
        """Record the names, FLOPs and weights (for `model_name`) of `tasks` in `tasks.json`. With
        `complete`, these are all the model's tasks now: those of an earlier lowering (another layout)
        keep their names but no longer count as the model's."""
        known = self.task_names()
        for entry in known.values() if complete else ():
            entry["models"].pop(model_name, None)
        for t in tasks:
            entry = known.setdefault(str(t.workload_hash), {"name": t.name, "flops": t.flops, "models": {}})
            entry["models"][model_name] = t.weight
        write_json(self.path / "tasks.json", known)

    def load_cost_model(self, threads: int, path: Path | None = None):
        """This budget's XGBoost cost model (or the one at `path`), with the data it was trained on
        (fresh if none; a file that does not load is set aside, `cost_model.load`)."""
        return cost_model.load(path or self.cost_model_file, threads)

    def save_cost_model(self, model, path: Path | None = None) -> None:
        """Replace the cost model file (this budget's, or `path`) atomically."""
        cost_model.save(model, path or self.cost_model_file)

    def rebuild_cost_model(self, threads: int = 1) -> None:
        """Retrain this budget's cost model on every record it holds (after a merge added some): the
        cost model's data is its records' features, so the model and the records never disagree. Data
        a warm start brought from another budget (`resaware.tuning.transfer`) stays."""
        model = cost_model.fresh(threads)
        if self.cost_model_file.exists():
            model.data = {k: g for k, g in self.load_cost_model(threads).data.items() if DONOR_MARK in k}
            model.data_size = sum(len(g.costs) for g in model.data.values())
        cost_model.fit(model, self.database().get_all_tuning_records(), self.kind, threads)
        self.save_cost_model(model)

    @property
    def has_records(self) -> bool:
        """Whether this budget's database holds any record."""
        return self.record_file.exists() and self.record_file.stat().st_size > 0

    @property
    def validation_file(self) -> Path:
        """The cost model's validation log: one line per measured batch it had not trained on yet."""
        return self.path / "cost_model_validation.jsonl"

    def log_validation(self, samples: int, right: int, pairs: int, rmse: float) -> None:
        """Append how the cost model, last trained on `samples` records, did on a batch it had not seen:
        pairs of candidates ranked right of `pairs`, and the RMSE of its predicted normalised throughput."""
        with self.records_locked(), open(self.validation_file, "a") as f:
            f.write(json.dumps({"samples": samples, "right": right, "pairs": pairs, "rmse": rmse}) + "\n")

    def validation(self, last: int = 20) -> Validated | None:
        """The cost model's record over its last `last` validated batches; None before any."""
        entries = []
        for _, line, _ in records.lines(self.validation_file):
            try:
                entry = json.loads(line)
                entries.append((int(entry["samples"]), int(entry["right"]), int(entry["pairs"]), float(entry["rmse"])))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a killed tuner
        entries = [e for e in entries if e[2] > 0][-last:]
        if not entries:
            return None
        return Validated(sum(e[1] for e in entries) / sum(e[2] for e in entries),
                         sum(e[3] for e in entries) / len(entries), len(entries), entries[-1][0])  # fmt: skip

    def client_cost_model_file(self, client: int) -> Path:
        """Where concurrent client `client` keeps its cost model until the merge."""
        return self.path / f".cost_model.client{client}.tar"

    def merge_cost_models(self, parts: list[Path]) -> None:
        """Fold cost models that concurrent clients trained on disjoint tasks into this budget's, and
        retrain it on the union (`cost_model.merge`); the parts' files are removed."""
        found = [p for p in parts if p.exists()]  # a client that died before its first save added nothing
        base = self.load_cost_model(1)
        cost_model.merge(base, [self.load_cost_model(1, p) for p in found])
        self.save_cost_model(base)
        for part in found:
            part.unlink()

    def locked(self):
        """Hold this budget's lock: one tuner writes a budget's database at a time (another process
        holding it is refused in one line, not waited for)."""
        return files.locked(self.path / ".lock", busy=f"another tuner is writing {self.path}: wait for it to "
                            "finish, or use another --store")  # fmt: skip

