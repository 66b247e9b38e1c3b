"""The store: a directory of slots (`resaware.store.slot`), keyed by hardware, target kind and realised budget.

    ROOT/store.json                            the store's format version
    ROOT/<hardware id>/hardware.json
    ROOT/<hardware id>/<target kind>/<share key>/   a slot

The store knows records, cost models and hardware; not how they were tuned nor how they are compiled.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from resaware.errors import ResawareError
from resaware.files import read_json, write_json
from resaware.platform.hardware import Hardware
from resaware.store.slot import Slot


def default_root() -> Path:
    """`$RESAWARE_STORE`, else the user's cache directory."""
    if os.environ.get("RESAWARE_STORE"):
        return Path(os.environ["RESAWARE_STORE"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache) / "resaware" / "store"


def nearest(slots: list[Slot], fraction: float) -> Slot | None:
    """The slot whose realised budget is closest to `fraction`; ties go to the larger budget."""
    if not slots:
        return None
    return min(slots, key=lambda s: (round(abs(s.fraction - fraction), 9), -s.fraction))


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
