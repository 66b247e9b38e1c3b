"""MetaSchedule's JSON database as resaware reads and appends to it: its lines parsed in one place,
damaged lines set aside, and appends from several processes made safe.

A workload line is `[structural hash, module]`; a record line is `[workload index, [trace, run_secs,
target, args_info]]`, the index being the workload's line number in the workload file.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.database import JSONDatabase, PyDatabase, TuningRecord, Workload

from resaware import files
from resaware.errors import ResawareError

FAILED = 1e9  # MetaSchedule records a failed build or run with a huge cost


@dataclass(frozen=True)
class WorkloadStats:
    """Trials and best mean latency of one workload in a database."""

    trials: int
    best_s: float | None  # mean seconds of the best valid record


@dataclass(frozen=True)
class RecordLine:
    """One line of a tuning-record file, parsed (`parse_record`)."""

    workload: int  # the workload's index in the workload file
    body: list  # [trace, run_secs, target, args_info]

    @property
    def run_secs(self):
        return self.body[1]

    @property
    def trace(self) -> str:
        """The candidate's trace, canonically serialised: with the workload, what identifies a candidate."""
        return json.dumps(self.body[0], separators=(",", ":"), sort_keys=True)

    def line(self, workload: int | None = None) -> bytes:
        """The line again, pointing at `workload` (default: its own index)."""
        index = self.workload if workload is None else workload
        return json.dumps([index, self.body], separators=(",", ":")).encode()


def parse_record(line: bytes | str) -> RecordLine:
    """A record line parsed; ValueError saying what is wrong when it is not one."""
    try:
        entry = json.loads(line)
    except ValueError:
        raise ValueError("not JSON") from None
    if not (isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is int and isinstance(entry[1], list)):
        raise ValueError("not a tuning record ([workload, record])")
    if len(entry[1]) < 2:
        raise ValueError("a tuning record without its timings")
    return RecordLine(entry[0], entry[1])


def parse_workload(line: bytes | str) -> list:
    """A workload line parsed as `[hash, module]`; ValueError saying what is wrong when it is not one."""
    try:
        entry = json.loads(line)
    except ValueError:
        raise ValueError("not JSON") from None
    if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
        raise ValueError("not a workload ([hash, module])")
    return entry


def lines(path: Path) -> list[tuple[int, bytes, bool]]:
    """A file's non-blank lines: (line number, line, whether it ended with a newline; a killed writer's may not)."""
    data = path.read_bytes() if path.exists() else b""
    parts = data.split(b"\n")
    return [(i + 1, line, i < len(parts) - 1) for i, line in enumerate(parts) if line.strip()]


def workload_hashes(path: Path) -> list[int | None]:
    """Workload index -> structural hash (None for a damaged line, whose records are set aside on open)."""
    hashes = []
    for _, line, _ in lines(path):
        try:
            hashes.append(int(parse_workload(line)[0]))
        except ValueError:
            hashes.append(None)
    return hashes


def workload_modules(path: Path) -> list:
    """The IR modules of a workload file's workloads, in order."""
    return [Workload.from_json(parse_workload(line)).mod for _, line, _ in lines(path)]


def mean_seconds(run_secs) -> float | None:
    """The mean of a candidate's timings, or None when it failed (MetaSchedule records failure as a huge cost)."""
    values = [float(s) for s in (run_secs or [])]
    return sum(values) / len(values) if values and max(values) < FAILED else None


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


def top_records(database, mod, count: int) -> list:
    """A database's `count` best records of the workload `mod`; none if it never saw it (read only:
    `commit_workload` would add the workload to the file)."""
    if count <= 0 or not database.has_workload(mod):
        return []
    return list(database.get_top_k(database.commit_workload(mod), count))


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


def open_database(workload_file: Path, record_file: Path) -> JSONDatabase:
    """The JSON database of these files, damaged lines set aside first (hold the records lock)."""
    repair(workload_file, record_file)
    try:
        return JSONDatabase(str(workload_file), str(record_file), module_equality="structural")
    except Exception:  # a line TVM refuses although it looks right: check every line with TVM itself
        repair(workload_file, record_file, deep=True)
        return JSONDatabase(str(workload_file), str(record_file), module_equality="structural")


def repair(workload_file: Path, record_file: Path, deep: bool = False) -> int:
    """Set aside the lines of a database that cannot load (cut short by a killed process, or damaged by
    hand) into `<file>.corrupt`, warning with file and line; return how many. `deep` also has TVM parse
    every record (slower; for lines that look right). Hold the records lock."""
    bad: list[tuple[Path, int, bytes, str]] = []  # file, line number, line, what is wrong
    kept_workloads, workloads, renumber = [], [], {}
    for index, (number, line, ended) in enumerate(lines(workload_file)):
        try:
            entry = parse_workload(line)
            try:
                workload = Workload.from_json(entry)
            except Exception:
                raise ValueError("its module does not load") from None
        except ValueError as error:
            bad.append((workload_file, number, line, str(error) if ended else f"{error}, cut short"))
            continue
        renumber[index] = len(kept_workloads)
        kept_workloads.append(line)
        workloads.append(workload)
    kept_records = []
    for number, line, ended in lines(record_file):
        try:
            record = parse_record(line)
            if record.workload not in renumber:
                raise ValueError(f"its workload {record.workload} is not in the workload file")
            index = renumber[record.workload]
            if deep:
                try:
                    TuningRecord.from_json(record.body, workloads[index])
                except Exception:
                    raise ValueError("TVM cannot read it") from None
            kept_records.append(line if index == record.workload else record.line(index))
        except ValueError as error:
            bad.append((record_file, number, line, str(error) if ended else f"{error}, cut short"))
    for path, _, line, _ in bad:  # set aside, never deleted
        with open(f"{path}.corrupt", "ab") as f:
            f.write(line + b"\n")
    # Also rewritten: a last line without its newline (the next append would run on into it) and
    # blank lines (TVM's reader crashes on them). Safe under the records lock: TVM opens the file anew
    # for every append, so no writer holds the old one.
    for path, kept in ((workload_file, kept_workloads), (record_file, kept_records)):
        if path.exists() and path.read_bytes() != b"".join(line + b"\n" for line in kept):
            files.write_bytes(path, b"".join(line + b"\n" for line in kept))
    for path, number, _, why in bad[:5]:
        print(f"resaware: warning: skipped line {number} of {path} ({why}); kept in {path.name}.corrupt",
              file=sys.stderr)  # fmt: skip
    if len(bad) > 5:
        print(f"resaware: warning: and {len(bad) - 5} more such lines, kept beside them", file=sys.stderr)
    return len(bad)


@derived_object
class SharedAppends(PyDatabase):
    """A budget's JSON database as every tuner appends to it, alone or beside other processes.

    TVM appends a record in more than one write (the line, then its newline), so each append takes the
    records lock, and a process killed mid-append leaves at most one cut line, which the next open sets
    aside (`repair`). A workload's id is its line number in the workload file, so workloads must all be
    committed beforehand (`Slot.commit_workloads`): two processes appending one each would give both the
    same id.
    """

    def __init__(self, workload_file: str, record_file: str, lock_path: str, donor=None):
        super().__init__()  # TVM compares workloads structurally by default, like `Slot.database`
        self.donor = donor  # anything with `top_k(mod, count)`: another budget's best records, for the search's start
        self.lock_path = lock_path
        with files.locked(lock_path):  # another process may be half-way through a line
            self.inner = JSONDatabase(workload_file, record_file, module_equality="structural")

    def has_workload(self, mod):
        return self.inner.has_workload(mod)

    def commit_workload(self, mod):
        if not self.inner.has_workload(mod):
            raise ResawareError("a workload was not committed before concurrent tuning began (a resaware bug)")
        return self.inner.commit_workload(mod)

    def commit_tuning_record(self, record):
        with files.locked(self.lock_path):
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

