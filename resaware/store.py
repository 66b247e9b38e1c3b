"""The store: tuning records and cost models, keyed by hardware, target kind and realised budget.

    ROOT/<hardware id>/hardware.json
    ROOT/<hardware id>/<target kind>/<share key>/budget.json
                                                 database_workload.json         (MetaSchedule JSON)
                                                 database_tuning_record.json    (one record a line)
                                                 cost_model.tar                 (XGBoost, with its data)
                                                 tasks.json                     (names of the workloads)

MetaSchedule's lookup ignores the target, so each budget has a database of its own. The store knows
records, cost models and hardware; not how they were tuned nor how they are compiled.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import quiet
from .errors import ResawareError
from .hardware import Hardware

FAILED = 1e9  # MetaSchedule records a failed build or run with a huge cost


def default_root() -> Path:
    """`$RESAWARE_STORE`, else the user's cache directory."""
    if os.environ.get("RESAWARE_STORE"):
        return Path(os.environ["RESAWARE_STORE"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache) / "resaware" / "store"


def write_json(path: Path, data) -> None:
    """Write a whole file atomically: readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return default
    except json.JSONDecodeError as error:
        raise ResawareError(f"{path} is not valid JSON ({error}): restore it or remove the file") from None


@dataclass(frozen=True)
class WorkloadStats:
    trials: int
    best_s: float | None  # mean seconds of the best valid record


class Slot:
    """One (hardware, target kind, realised budget) corner of the store."""

    def __init__(self, path: Path, hardware: Hardware, kind: str, key: str, info: dict):
        self.path, self.hardware, self.kind, self.key, self.info = path, hardware, kind, key, info

    @property
    def fraction(self) -> float:
        return float(self.info["fraction"])

    @property
    def workload_file(self) -> Path:
        return self.path / "database_workload.json"

    @property
    def record_file(self) -> Path:
        return self.path / "database_tuning_record.json"

    @property
    def cost_model_file(self) -> Path:
        return self.path / "cost_model.tar"

    def database(self):
        """The MetaSchedule JSON database of this budget (created empty if missing)."""
        from tvm.s_tir.meta_schedule.database import JSONDatabase

        return JSONDatabase(str(self.workload_file), str(self.record_file), module_equality="structural")

    def stats(self, database=None) -> dict[int, WorkloadStats]:
        """Trials and best latency per workload (keyed by structural hash)."""
        import tvm_ffi

        if not self.record_file.exists():
            return {}
        database = database or self.database()
        trials: dict[int, int] = {}
        best: dict[int, float] = {}
        for record in database.get_all_tuning_records():
            key = int(tvm_ffi.structural_hash(record.workload.mod))
            trials[key] = trials.get(key, 0) + 1
            secs = [float(s) for s in (record.run_secs or [])]
            if secs and max(secs) < FAILED:
                mean = sum(secs) / len(secs)
                best[key] = min(best.get(key, mean), mean)
        return {k: WorkloadStats(n, best.get(k)) for k, n in trials.items()}

    def task_names(self) -> dict[str, dict]:
        return read_json(self.path / "tasks.json", {})

    def remember_tasks(self, tasks, model_name: str) -> None:
        known = self.task_names()
        for t in tasks:
            entry = known.setdefault(str(t.workload_hash), {"name": t.name, "flops": t.flops, "models": {}})
            entry["models"][model_name] = t.weight
        write_json(self.path / "tasks.json", known)

    def load_cost_model(self, threads: int):
        """This budget's XGBoost cost model, with the data it was trained on (fresh if none)."""
        from tvm.s_tir.meta_schedule.cost_model import XGBModel

        model = XGBModel(num_tuning_cores=threads, adaptive_training=True)
        if self.cost_model_file.exists():
            try:
                with quiet.xgboost_warnings():
                    model.load(str(self.cost_model_file))
            except Exception as error:  # a model saved before its first training has no booster
                print(f"resaware: cost model {self.cost_model_file} not loaded ({error}); starting afresh")
                model = XGBModel(num_tuning_cores=threads, adaptive_training=True)
        return model

    def save_cost_model(self, model) -> None:
        if getattr(model, "booster", None) is None:
            return  # nothing trained yet; its data is in the records anyway
        tmp = self.path / f".cost_model.{os.getpid()}.tar"
        with quiet.xgboost_warnings():
            model.save(str(tmp))
        os.replace(tmp, self.cost_model_file)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold this budget's lock: one tuner writes a budget's database at a time."""
        with open(self.path / ".lock", "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ResawareError(
                    f"another tuner is writing {self.path}: wait for it to finish, or use another --store"
                ) from None
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


class Store:
    """A directory of slots. `Store.open(None)` uses `$RESAWARE_STORE` or the user cache."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    @classmethod
    def open(cls, store: Store | str | os.PathLike | None = None) -> Store:
        if isinstance(store, Store):
            return store
        root = Path(store) if store is not None else default_root()
        if root.exists() and not root.is_dir():
            raise ResawareError(f"store {root} is a file, not a directory: give a directory for --store")
        return cls(root)

    def slot(self, hardware: Hardware, kind: str, key: str, fraction: float, target: str) -> Slot:
        """The slot for a realised budget, created on first use."""
        hw_dir = self.root / hardware.id
        path = hw_dir / kind / key
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ResawareError(
                f"cannot create store directory {path} ({error.strerror}): choose a writable --store"
            ) from None
        if not (hw_dir / "hardware.json").exists():
            write_json(hw_dir / "hardware.json", hardware.to_json())
        info = read_json(path / "budget.json")
        if info is None:
            info = {"fraction": fraction, "key": key, "kind": kind, "target": json.loads(target)}
            write_json(path / "budget.json", info)
        return Slot(path, hardware, kind, key, info)

    def hardware(self) -> list[Hardware]:
        found = []
        for path in sorted(self.root.glob("*/hardware.json")):
            found.append(Hardware.from_json(read_json(path)))
        return found

    def slots(self, hardware: Hardware | None = None, kind: str | None = None) -> list[Slot]:
        """Every slot that exists, optionally only for one hardware and target kind."""
        found = []
        for hw in self.hardware():
            if hardware is not None and hw.id != hardware.id:
                continue
            for budget_file in sorted((self.root / hw.id).glob("*/*/budget.json")):
                info = read_json(budget_file)
                if kind is None or info["kind"] == kind:
                    found.append(Slot(budget_file.parent, hw, info["kind"], info["key"], info))
        return sorted(found, key=lambda s: (s.hardware.id, s.kind, s.fraction))

    def show(self, verbose: bool = False) -> str:
        """A readable listing: hardware, then each budget with its tasks, trials and best latencies."""
        lines = [f"store {self.root}"]
        slots = self.slots()
        if not slots:
            return lines[0] + ": empty (tune a model first: resaware tune MODEL --store DIR)"
        current = None
        for slot in slots:
            if slot.hardware.id != current:
                current = slot.hardware.id
                lines.append(f"\nhardware {current}: {slot.hardware.describe()}")
                lines.append(
                    f"  {'target':<6} {'budget':>7} {'share':<9} {'tasks':>5} {'trials':>7} {'sum of best task latencies':>28}"
                )
            stats = slot.stats()
            names = slot.task_names()
            total = sum(s.best_s for s in stats.values() if s.best_s is not None)
            trials = sum(s.trials for s in stats.values())
            lines.append(
                f"  {slot.kind:<6} {slot.fraction:>7.0%} {slot.key:<9} {len(stats):>5} {trials:>7} {total * 1e3:>25.3f} ms"
            )
            if verbose:
                for key, s in sorted(stats.items(), key=lambda kv: -(kv[1].best_s or 0)):
                    name = names.get(str(key), {}).get("name", f"workload {key:x}")
                    best = f"{s.best_s * 1e6:.1f} us" if s.best_s is not None else "no valid record"
                    lines.append(f"      {name[:48]:<48} {s.trials:>5} trials  best {best}")
        return "\n".join(lines)
