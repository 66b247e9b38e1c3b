"""Compiled modules and ONNX Runtime timed side by side at one budget: what every script that compares
latencies shares (`time_to_quality.py`, `retime.py`, `layout.py`, `tuning_speed.py`).

Each module's outputs are checked against ONNX Runtime's before it is timed, every arm is timed in a
child confined to the budget's cores, and the arms take turns over rounds (`resaware.bench.interleaved`),
so that a machine's drift reaches them all alike.
"""

from __future__ import annotations

import functools
import statistics
from pathlib import Path

from common import probed
from resaware.analysis import reference
from resaware.analysis.bench import interleaved, rel_error
from resaware.budget import Budget
from resaware.frontend.model import Model
from resaware.platform import confine
from resaware.runtime.compiled import load, run_confined

ORT = "ONNX Runtime"


class SideBySide:
    """The arms to time at `budget`, each for `repeat` runs after 2 warm-ups and at least `min_seconds`."""

    def __init__(self, model: Model, budget: str, repeat: int, tolerance: float = 1e-3, min_seconds: float = 1.0):
        self.model, self.budget, self.tolerance = model, budget, tolerance
        self.share = Budget.parse(budget).cpu(confine.usable_cores())
        self.inputs, self.specs = model.random_inputs(0), [s.to_json() for s in model.inputs]
        self.expected = reference.outputs(model, self.inputs)
        self.timing = (repeat, 2, min_seconds)
        self.timers: dict = {}
        self.info: dict = {}

    def module(self, key, path: str | Path, check: bool = True) -> float:
        """Time the module exported at `path` as `key`; its largest relative error against ONNX Runtime,
        which ends the run with one line saying so when over `tolerance` (unless not `check`). Its
        provenance (`CompiledModel.info`) goes to `info[key]`."""
        compiled = load(path)
        error = rel_error(compiled(*self.inputs), self.expected)
        if check and error >= self.tolerance:
            raise SystemExit(
                f"{key}: outputs differ from ONNX Runtime (relative error {error:.1e}, over {self.tolerance:g})"
            )
        self.info[key] = compiled.info
        self.timers[key] = functools.partial(
            run_confined, str(path), self.share.cores, self.budget, *self.timing, self.specs
        )
        return error

    def onnx_runtime(self, key=ORT) -> None:
        """Time ONNX Runtime, its own threads confined to the same cores, as `key`."""
        self.timers[key] = functools.partial(reference.latency, self.model, self.share.cores, self.budget, *self.timing)

    def run(self, rounds: int, probe: bool = True) -> tuple[dict, dict]:
        """Time every arm once per round: ({key: [Latency per round]}, {key: [cross-core round trip ns
        after each timing]}). With two cores or more and `probe`, the round trip is probed after each
        timing: a kernel's threads read what the other core just wrote, and what that costs depends on
        where the host put the vCPUs, which can change from one timing to the next (`common.round_trip_ns`)."""
        trips = {key: [] for key in self.timers}
        timers = self.timers
        if probe and self.share.count > 1:
            timers = {
                key: functools.partial(probed, timer, trips[key], self.share.cores) for key, timer in timers.items()
            }
        return interleaved(timers, rounds), trips


def medians(runs: dict) -> dict:
    """Each arm's median over its rounds of the per-round median (ms)."""
    return {key: statistics.median(x.median_ms for x in latencies) for key, latencies in runs.items()}
