"""The store: tuning records and cost models per (hardware, target kind, realised budget), and moving
them between stores (`exchange`)."""

from resaware.store.cost_model import DONOR_MARK, Validated, fit, ranks, trained
from resaware.store.records import (
           FAILED,
           SharedAppends,
           WorkloadStats,
           mean_seconds,
           replay,
           top_records,
           workload_stats,
)
from resaware.store.slot import Slot
from resaware.store.store import Store, default_root, nearest

__all__ = ["DONOR_MARK", "FAILED", "SharedAppends", "Slot", "Store", "Validated", "WorkloadStats", "default_root", "fit",
           "mean_seconds", "nearest", "ranks", "replay", "top_records", "trained", "workload_stats"]  # fmt: skip
