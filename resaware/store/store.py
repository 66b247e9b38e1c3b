"""The store: tuning records and cost models, keyed by hardware, target kind and realised budget.

    ROOT/<hardware id>/hardware.json
    ROOT/<hardware id>/<target kind>/<share key>/budget.json
                                                 database_workload.json         (MetaSchedule JSON)
                                                 database_tuning_record.json    (one record a line)
                                                 cost_model.tar                 (XGBoost, with its data)
                                                 cost_model_validation.jsonl    (its ranking of each new batch)
                                                 tasks.json                     (names of the workloads)

MetaSchedule's lookup ignores the target, so each budget has a database of its own. The store knows
records, cost models and hardware; not how they were tuned nor how they are compiled.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.database import JSONDatabase, PyDatabase, TuningRecord, Workload

from resaware.errors import ResawareError
from resaware.platform import quiet
from resaware.platform.hardware import Hardware

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
    _readable(fd)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _readable(fd: int) -> None:
    """Give a temporary file the mode a plain `open` would (mkstemp makes it private to its owner)."""
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)


def read_json(path: Path, default=None):
    """The JSON in `path`, `default` when it does not exist; a clear error when it is damaged."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return default
    except json.JSONDecodeError as error:
        raise ResawareError(f"{path} is not valid JSON ({error}): restore it or remove the file") from None


@dataclass(frozen=True)
class Validated:
    """A cost model's record on batches it had not trained on (`Slot.validation`)."""

    pairwise: float  # share of candidate pairs it ordered as they measured (0.5: no better than a coin)
    rmse: float  # mean RMSE of its predicted normalised throughput (best so far / cost, 1 = as fast)
    batches: int
    samples: int  # what it was last trained on


@dataclass(frozen=True)
class WorkloadStats:
    """Trials and best mean latency of one workload in a database."""

    trials: int
    best_s: float | None  # mean seconds of the best valid record


def mean_seconds(run_secs) -> float | None:
    """The mean of a candidate's timings, or None when it failed (MetaSchedule records failure as a huge cost)."""
    values = [float(s) for s in (run_secs or [])]
    return sum(values) / len(values) if values and max(values) < FAILED else None


def trained(cost_model) -> bool:
    """Whether an XGBoost cost model has been trained (an untrained one ranks at random)."""
    return cost_model is not None and getattr(cost_model, "booster", None) is not None


def ranks(cost_model) -> bool:
    """Whether an XGBoost cost model ranks by what it learnt: trained, and past the samples below which
    MetaSchedule's XGBModel predicts at random."""
    return trained(cost_model) and cost_model.data_size >= cost_model.num_warmup_samples


def replay(record, mod=None):
    """A tuning record's schedule as a MetaSchedule MeasureCandidate (of `mod`, else the record's
    workload), or None when its trace no longer replays."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    sch = tvm.s_tir.Schedule(mod if mod is not None else record.workload.mod)
    try:
        record.trace.apply_to_schedule(sch, remove_postproc=False)
    except Exception:
        return None
    return ms.MeasureCandidate(sch, record.args_info)


DONOR_MARK = "@"  # in a cost model's group key: data from another budget's records (`resaware.tuning.transfer`)


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


def top_records(database, mod, count: int) -> list:
    """A database's `count` best records of the workload `mod`; none if it never saw it (read only:
    `commit_workload` would add the workload to the file)."""
    if count <= 0 or not database.has_workload(mod):
        return []
    return list(database.get_top_k(database.commit_workload(mod), count))


def nearest(slots: list[Slot], fraction: float) -> Slot | None:
    """The slot whose realised budget is closest to `fraction`; ties go to the larger budget."""
    if not slots:
        return None
    return min(slots, key=lambda s: (round(abs(s.fraction - fraction), 9), -s.fraction))


def workload_stats(database) -> dict[int, WorkloadStats]:
    """Trials and best latency per workload of a MetaSchedule database (keyed by structural hash)."""
    trials: dict[int, int] = {}
    best: dict[int, float] = {}
    for record in database.get_all_tuning_records():
        key = int(tvm_ffi.structural_hash(record.workload.mod))
        trials[key] = trials.get(key, 0) + 1
        if (mean := mean_seconds(record.run_secs)) is not None:
            best[key] = min(best.get(key, mean), mean)
    return {k: WorkloadStats(n, best.get(k)) for k, n in trials.items()}


def _lines(path: Path) -> list[tuple[int, bytes, bool]]:
    """A file's non-blank lines: (line number, line, whether it ended with a newline; a killed writer's may not)."""
    data = path.read_bytes() if path.exists() else b""
    parts = data.split(b"\n")
    return [(i + 1, line, i < len(parts) - 1) for i, line in enumerate(parts) if line.strip()]


def _workload(line: bytes):
    """(the workload, None) for a loadable workload line, else (None, what is wrong with it)."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None, "not JSON"
    if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
        return None, "not a workload ([hash, module])"
    try:
        return Workload.from_json(entry), None
    except Exception:
        return None, "its module does not load"


def _record(line: bytes, renumber: dict[int, int], workloads: list, deep: bool):
    """(the line with its workload renumbered, None) for a loadable record line, else (None, what is
    wrong with it). `deep` also has TVM parse the trace (slower; for lines that look right)."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None, "not JSON"
    if not (isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is int and isinstance(entry[1], list)):
        return None, "not a tuning record ([workload, record])"
    if entry[0] not in renumber:
        return None, f"its workload {entry[0]} is not in the workload file"
    if deep:
        try:
            TuningRecord.from_json(entry[1], workloads[renumber[entry[0]]])
        except Exception:
            return None, "TVM cannot read it"
    if renumber[entry[0]] != entry[0]:
        entry[0] = renumber[entry[0]]
        return json.dumps(entry, separators=(",", ":")).encode(), None
    return line, None


def _rewrite(path: Path, lines: list[bytes]) -> None:
    """Replace a database file atomically. Safe under the records lock: TVM opens the file anew for
    every append, so no writer holds the old one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    _readable(fd)
    with os.fdopen(fd, "wb") as f:
        f.write(b"".join(line + b"\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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

    @contextmanager
    def records_locked(self) -> Iterator[None]:
        """Hold the lock every append to this budget's database takes (see `SharedAppends`)."""
        with open(self.records_lock_file, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def database(self):
        """The MetaSchedule JSON database of this budget (created empty if missing), for reading.
        Lines that cannot load are set aside first (`repair`)."""
        self.path.mkdir(parents=True, exist_ok=True)
        with self.records_locked():
            return self._open()

    def _open(self):  # under the records lock
        self._repair()
        try:
            return JSONDatabase(str(self.workload_file), str(self.record_file), module_equality="structural")
        except Exception:  # a line TVM refuses although it looks right: check every line with TVM itself
            self._repair(deep=True)
            return JSONDatabase(str(self.workload_file), str(self.record_file), module_equality="structural")

    def repair(self) -> int:
        """Set aside the lines of this budget's database that cannot load (cut short by a killed
        process, or damaged by hand) into `<file>.corrupt`, warning with file and line; return how many."""
        with self.records_locked():
            return self._repair()

    def _repair(self, deep: bool = False) -> int:
        bad: list[tuple[Path, int, bytes, str]] = []  # file, line number, line, what is wrong
        kept_workloads, workloads, renumber = [], [], {}
        for index, (number, line, ended) in enumerate(_lines(self.workload_file)):
            workload, why = _workload(line)
            if why is None:
                renumber[index] = len(kept_workloads)
                kept_workloads.append(line)
                workloads.append(workload)
            else:
                bad.append((self.workload_file, number, line, why if ended else f"{why}, cut short"))
        kept_records = []
        for number, line, ended in _lines(self.record_file):
            fixed, why = _record(line, renumber, workloads, deep)
            if why is None:
                kept_records.append(fixed)
            else:
                bad.append((self.record_file, number, line, why if ended else f"{why}, cut short"))
        for path, _, line, _ in bad:  # set aside, never deleted
            with open(f"{path}.corrupt", "ab") as f:
                f.write(line + b"\n")
        # Also rewritten: a last line without its newline (the next append would run on into it) and
        # blank lines (TVM's reader crashes on them).
        for path, kept in ((self.workload_file, kept_workloads), (self.record_file, kept_records)):
            if path.exists() and path.read_bytes() != b"".join(line + b"\n" for line in kept):
                _rewrite(path, kept)
        for path, number, _, why in bad[:5]:
            print(f"resaware: warning: skipped line {number} of {path} ({why}); kept in {path.name}.corrupt",
                  file=sys.stderr)  # fmt: skip
        if len(bad) > 5:
            print(f"resaware: warning: and {len(bad) - 5} more such lines, kept beside them", file=sys.stderr)
        return len(bad)

    def commit_workloads(self, mods) -> None:
        """Write these workloads into the database now, before any tuner appends records (see `SharedAppends`)."""
        self.path.mkdir(parents=True, exist_ok=True)
        with self.records_locked():
            database = self._open()
            for mod in mods:
                database.commit_workload(mod)

    def shared_database(self, donor: Slot | None = None):
        """This budget's database for a tuner appending to it, maybe beside others (see `SharedAppends`);
        with a `donor` budget, its best records fill in where this one has too few (a warm start)."""
        self.repair()
        from resaware.tuning.transfer import Donor

        return SharedAppends(str(self.workload_file), str(self.record_file), str(self.records_lock_file),
                             Donor(donor) if donor is not None else None)  # fmt: skip

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
        return workload_stats(database or self.database())

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
        hashes = []  # workload line -> structural hash, as TVM wrote it first on each line
        for _, line, _ in _lines(self.workload_file):
            try:
                hashes.append(int(json.loads(line)[0]))
            except (ValueError, IndexError, TypeError):
                hashes.append(None)  # the record lines that point here are set aside on open
        best: dict[int, float] = {}
        points: list[tuple[int, float | None]] = []
        for _, line, _ in _lines(self.record_file):
            try:
                index, (_, run_secs, *_) = json.loads(line)
                key, mean = hashes[index], mean_seconds(run_secs)
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
        (fresh if none)."""
        from tvm.s_tir.meta_schedule.cost_model import XGBModel

        path = path or self.cost_model_file
        model = XGBModel(num_tuning_cores=threads, adaptive_training=True)
        if path.exists():
            try:
                with quiet.xgboost_warnings():
                    model.load(str(path))
            except Exception as error:  # a model saved before its first training has no booster
                print(f"resaware: cost model {path} not loaded ({error}); starting afresh", file=sys.stderr)
                model = XGBModel(num_tuning_cores=threads, adaptive_training=True)
        return model

    def save_cost_model(self, model, path: Path | None = None) -> None:
        """Replace the cost model file (this budget's, or `path`) atomically."""
        if getattr(model, "booster", None) is None:
            return  # nothing trained yet; its data is in the records anyway
        path = path or self.cost_model_file
        tmp = self.path / f".cost_model.{os.getpid()}.tar"
        with quiet.xgboost_warnings():
            model.save(str(tmp))
        os.replace(tmp, path)

    def rebuild_cost_model(self, threads: int = 1) -> None:
        """Retrain this budget's cost model on every record it holds (after a merge added some): the
        cost model's data is its records' features, so the model and the records never disagree. Data
        a warm start brought from another budget (`resaware.tuning.transfer`) stays."""
        from tvm.s_tir.meta_schedule.cost_model import XGBModel

        model = XGBModel(num_tuning_cores=threads, adaptive_training=True)
        if self.cost_model_file.exists():
            model.data = {k: g for k, g in self.load_cost_model(threads).data.items() if DONOR_MARK in k}
            model.data_size = sum(len(g.costs) for g in model.data.values())
        fit(model, self.database().get_all_tuning_records(), self.kind, threads)
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
        for _, line, _ in _lines(self.validation_file):
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
        """Fold cost models that concurrent clients trained on disjoint tasks into this budget's.

        Each part began as this budget's model and added data for its own tasks only, so the largest
        feature group per workload is the union. The booster kept is the one trained on most data; it
        is retrained on the merged data at the next run's first update.
        """
        base = self.load_cost_model(1)
        best_size = -1
        for part in parts:
            if not part.exists():
                continue  # a client that died before its first save added nothing
            model = self.load_cost_model(1, part)
            for key, group in model.data.items():
                if key not in base.data or len(group.costs) > len(base.data[key].costs):
                    base.data[key] = group
            if model.booster is not None and model.data_size > best_size:
                base.booster, best_size = model.booster, model.data_size
            part.unlink()
        base.data_size = sum(len(g.costs) for g in base.data.values())
        self.save_cost_model(base)

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


@derived_object
class SharedAppends(PyDatabase):
    """A budget's JSON database as every tuner appends to it, alone or beside other processes.

    TVM appends a record in more than one write (the line, then its newline), so each append takes the
    records lock, and a process killed mid-append leaves at most one cut line, which the next open sets
    aside (`Slot.repair`). A workload's id is its line number in the workload file, so workloads must
    all be committed beforehand (`Slot.commit_workloads`): two processes appending one each would give
    both the same id.
    """

    def __init__(self, workload_file: str, record_file: str, lock_path: str, donor=None):
        super().__init__()  # TVM compares workloads structurally by default, like `Slot.database`
        self.donor = donor  # a `transfer.Donor`: another budget's best records, for the search's start
        self.lock = open(lock_path, "a")
        with self.locked():  # another process may be half-way through a line
            self.inner = JSONDatabase(workload_file, record_file, module_equality="structural")

    @contextmanager
    def locked(self) -> Iterator[None]:
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)

    def has_workload(self, mod):
        return self.inner.has_workload(mod)

    def commit_workload(self, mod):
        if not self.inner.has_workload(mod):
            raise ResawareError("a workload was not committed before concurrent tuning began (a resaware bug)")
        return self.inner.commit_workload(mod)

    def commit_tuning_record(self, record):
        with self.locked():
            self.inner.commit_tuning_record(record)

    def get_top_k(self, workload, top_k):
        # MetaSchedule reads this only for the initial population of its evolutionary search.
        top = self.inner.get_top_k(workload, top_k)
        if self.donor is None or len(top) >= top_k:
            return top
        return [*top, *self.donor.top_k(workload.mod, top_k - len(top))]

    def get_all_tuning_records(self):
        return self.inner.get_all_tuning_records()

    def query_tuning_record(self, mod, target, workload_name):
        return self.inner.query_tuning_record(mod, target, workload_name)

    def query_schedule(self, mod, target, workload_name):
        return self.inner.query_schedule(mod, target, workload_name)

    def query_ir_module(self, mod, target, workload_name):
        return self.inner.query_ir_module(mod, target, workload_name)

    def __len__(self):
        return len(self.inner)


class Store:
    """A directory of slots. `Store.open(None)` uses `$RESAWARE_STORE` or the user cache."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    @classmethod
    def open(cls, store: Store | str | os.PathLike | None = None) -> Store:
        """A Store for `store` (a Store, a directory, or None for the default root)."""
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
        """Every hardware the store holds records for."""
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

    def slots_for(self, hardware: Hardware, kind: str, allow_mismatch: bool = False) -> list[Slot]:
        """The slots to compile for `hardware` from: its own; if it has none, those of the stored
        hardware closest to it, only when `allow_mismatch` (warned), else refused with the field table.
        An empty store gives none (the caller warns)."""
        own = self.slots(hardware, kind)
        others = [h for h in self.hardware() if h.id != hardware.id and self.slots(h, kind)]
        if own or not others:
            return own
        closest = min(others, key=lambda h: (len(hardware.differences(h)), h.id))
        differs = ", ".join(hardware.differences(closest)) or "nothing but the id"
        if not allow_mismatch:
            also = (
                f" (and {len(others) - 1} more: {', '.join(h.id for h in others if h is not closest)})"
                if len(others) > 1
                else ""
            )
            raise ResawareError(
                f"store {self.root} has {kind} records only for other hardware, and records measured on other "
                f"hardware can mislead the schedules; the closest, {closest.id}{also}, differs in {differs}:\n"
                f"{hardware.mismatch_table(closest)}\n"
                f"tune on this machine, or pass --allow-mismatch (API: allow_mismatch=True) to use them anyway"
            )
        print(f"resaware: warning: using records of other hardware {closest.id} (differs in {differs}); "
              f"latencies may not carry over", file=sys.stderr)  # fmt: skip
        return self.slots(closest, kind)

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
                    f"  {'cost model on new batches':<30}"
                )
            stats = slot.stats()
            names = slot.task_names()
            total = sum(s.best_s for s in stats.values() if s.best_s is not None)
            trials = sum(s.trials for s in stats.values())
            checked = slot.validation()
            ranking = (
                f"{checked.pairwise:.0%} of pairs, rmse {checked.rmse:.2f} ({checked.batches} batches)"
                if checked
                else "-"
            )
            lines.append(
                f"  {slot.kind:<6} {slot.fraction:>7.0%} {slot.key:<9} {len(stats):>5} {trials:>7} {total * 1e3:>25.3f} ms"
                f"  {ranking}"
            )
            if verbose:
                for key, s in sorted(stats.items(), key=lambda kv: -(kv[1].best_s or 0)):
                    name = names.get(str(key), {}).get("name", f"workload {key:x}")
                    best = f"{s.best_s * 1e6:.1f} us" if s.best_s is not None else "no valid record"
                    lines.append(f"      {name[:48]:<48} {s.trials:>5} trials  best {best}")
        return "\n".join(lines)
