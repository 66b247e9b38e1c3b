"""Moving tuning results between stores: merge, export to one archive file, import.

Records stay under the hardware and budget they were measured at, so stores of different machines
merge side by side and never mix. Within a budget the result is the union of the records, identical
traces removed: a candidate (workload and trace) already there is skipped and counted, whatever its
timings, so a store merged twice or an export imported back adds nothing and, as within one tuning
run, each candidate is measured once in the cost model's training data.
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from resaware import files
from resaware.errors import ResawareError
from resaware.files import read_json, write_json
from resaware.store import Slot, Store, records

ARCHIVE_ROOT = "resaware-store"


@dataclass
class Merged:
    """What one budget of a source store added to the destination."""

    slot: str  # hardware id / kind / share key
    records: int  # in the source
    added: int
    duplicates: int

    def line(self) -> str:
        """One line of the merge report."""
        return f"  {self.slot:<60} {self.records:>7} records: {self.added:>6} added, {self.duplicates:>6} already there"


def known_candidates(slot: Slot) -> tuple[list[int | None], list[tuple[tuple[int, str], records.RecordLine]]]:
    """Workload index -> workload hash, and per record line ((workload hash, trace), the record). A
    candidate is its workload and trace: MetaSchedule measures each once per store. Hold the records
    lock, and repair the slot first: every line then parses."""
    hashes = records.workload_hashes(slot.workload_file)
    found = []
    for _, line, _ in records.lines(slot.record_file):
        record = records.parse_record(line)
        found.append(((hashes[record.workload], record.trace), record))
    return hashes, found


def merge_slot(source: Slot, into: Store) -> Merged:
    """Append the records of `source` that `into` lacks to its slot for the same hardware and budget."""
    source.repair()  # sets aside lines that cannot load, so only loadable records travel
    target = into.slot(source.hardware, source.kind, source.key, source.fraction, json.dumps(source.info["target"]))
    name = f"{source.hardware.id}/{source.kind}/{source.key}"
    with target.locked():
        if (caches := source.caches()) is not None and source.kind == "llvm":
            target.refuse_other_caches(caches, f"those of {source.path.parent.parent.parent}")
            target.time_as(caches)
        # Workloads and records read under the source's lock, together: a tuner committing a workload and
        # its records meanwhile would otherwise leave records pointing past the workloads read.
        with source.records_locked():
            source.repair()  # a process killed mid-append since leaves a cut line
            mods = records.workload_modules(source.workload_file)
            _, theirs = known_candidates(source)
        target.commit_workloads(mods)
        with target.records_locked():
            target.repair()
            hashes, ours = known_candidates(target)
            index = {h: i for i, h in enumerate(hashes)}
            seen = {candidate for candidate, _ in ours}
            new = []
            for candidate, record in theirs:
                if candidate not in seen:
                    seen.add(candidate)
                    new.append(record.line(index[candidate[0]]) + b"\n")
            with open(target.record_file, "ab") as f:
                f.write(b"".join(new))
                f.flush()
                os.fsync(f.fileno())
        _merge_side_files(source, target)
        if new:
            target.rebuild_cost_model()
    return Merged(name, len(theirs), len(new), len(theirs) - len(new))


def _merge_side_files(source: Slot, target: Slot) -> None:
    """Task names (union of models) and set-aside corrupt lines (kept, never dropped)."""
    known = target.task_names()
    for key, entry in source.task_names().items():
        mine = known.setdefault(key, {**entry, "models": {}})
        mine["models"].update(entry.get("models", {}))
    write_json(target.path / "tasks.json", known)
    for corrupt in source.path.glob("*.corrupt"):
        with open(target.path / corrupt.name, "ab") as f:
            f.write(corrupt.read_bytes())


def merge(sources: list[Store | str | os.PathLike], into: Store | str | os.PathLike) -> list[Merged]:
    """Merge every budget of every source store into `into` (created if missing)."""
    into = Store.open(into)
    done = []
    for source in sources:
        source = Store.open(source)
        if not source.root.is_dir():
            raise ResawareError(f"store {source.root} does not exist: give an existing store directory")
        if source.root.resolve() == into.root.resolve():
            raise ResawareError(f"store {source.root} is the destination itself: give another source")
        slots = source.slots()
        if not slots:
            print(f"resaware: warning: store {source.root} has no budgets; nothing to merge from it", file=sys.stderr)
        for slot in slots:  # every budget before any is merged: all or none
            if (caches := slot.caches()) is not None and slot.kind == "llvm":
                ours = into.root / slot.path.relative_to(source.root)
                if ours.is_dir():
                    Slot.open(ours).refuse_other_caches(caches, f"those of {source.root}")
        done += [merge_slot(slot, into) for slot in slots]
    return done


def export(store: Store | str | os.PathLike, path: str | os.PathLike) -> Path:
    """Write the whole store as one .tar.gz (records, cost models, task names; no lock files)."""
    store = Store.open(store)
    slots = store.slots()
    if not slots:
        raise ResawareError(f"store {store.root} has no budgets to export: tune a model first")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with files.replacing(path) as tmp, tarfile.open(tmp, "w:gz") as tar:
        for hw in store.hardware():
            tar.add(store.root / hw.id / "hardware.json", f"{ARCHIVE_ROOT}/{hw.id}/hardware.json")
        for slot in slots:
            slot.repair()  # sets aside lines that cannot load
            with slot.records_locked():  # a consistent copy even while a tuner appends
                for file in sorted(slot.path.iterdir()):
                    if file.is_file() and not file.name.startswith("."):
                        tar.add(file, f"{ARCHIVE_ROOT}/{file.relative_to(store.root)}")
    return path


def import_(path: str | os.PathLike, into: Store | str | os.PathLike) -> list[Merged]:
    """Merge an archive written by `export` into the store `into`; what is there already stays."""
    path = Path(path)
    if not path.is_file():
        raise ResawareError(f"archive {path} does not exist: write one with `resaware store export -o FILE`")
    with tempfile.TemporaryDirectory(prefix="resaware-import-") as tmp:
        try:
            with tarfile.open(path, "r:*") as tar:
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError) as error:
            why = str(error).splitlines()[0].rstrip(":")
            raise ResawareError(
                f"{path} is not a store archive ({why}): write one with `resaware store export`"
            ) from None
        root = Path(tmp) / ARCHIVE_ROOT
        if not root.is_dir() or not any(read_json(p) for p in root.glob("*/hardware.json")):
            raise ResawareError(f"{path} is not a store archive (no {ARCHIVE_ROOT}/*/hardware.json inside)")
        return merge([root], into)
