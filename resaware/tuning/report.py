"""What `resaware.tune` returns: per budget, its tasks' best latencies, the re-measured best schedules,
the model estimate's history and why tuning stopped; a table of it all."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field


@dataclass
class ClientReport:
    """What one client did: where it measured, where its search and builds ran, and its time split."""

    cores: list[int]
    tuner_cores: list[int]
    tasks: int
    trials: int
    wall_s: float
    stopped_by: str
    phases: dict[str, float]  # search, cost_model, build, run, other (seconds)
    window: tuple[float, float] = (0.0, 0.0)  # when it tuned, seconds since the epoch
    worker_cores: list[int] | None = None  # every thread mask of its measuring worker, read from inside it
    # Seconds its worker spent timing batches. The "run" phase is the time the tuner waited for them, less
    # when it searched meanwhile (`measure.TunerCores`); None: measured elsewhere (RPC), "run" it is.
    measuring_s: float | None = None

    @property
    def measure_rate(self) -> float | None:
        """Candidates measured per second of measuring."""
        run = self.measuring_s if self.measuring_s is not None else self.phases.get("run", 0.0)
        return self.trials / run if run > 0 else None


@dataclass
class TaskResult:
    """One task after tuning: trials in the store and best latency."""

    name: str
    weight: int
    flops: float
    trials: int
    best_s: float | None


@dataclass
class Verification:
    """A best schedule re-measured after tuning: alone, and (when clients measured at once) while every
    partition measures, interleaved so that both see the machine in the same state."""

    task: str
    recorded_s: float  # what tuning recorded
    remeasured_s: float  # alone, on the budget's cores
    together_s: float | None = None  # on the same cores while the other partitions measure too

    @property
    def ratio(self) -> float:
        """Alone now / recorded then: drift since tuning, of the machine or from how it was measured."""
        return self.remeasured_s / self.recorded_s

    @property
    def concurrency_ratio(self) -> float | None:
        """Together / alone at the same moment: what measuring beside other partitions does to a time."""
        return self.together_s / self.remeasured_s if self.together_s is not None else None


@dataclass
class BudgetResult:
    """What tuning one budget did: trials, time, tasks, history, clients and re-measurements."""

    budget: str  # as asked
    realised: float  # fraction of the usable cores
    cores: list[int]  # the budget's share (partition 0)
    concurrency: int  # clients that tuned at once, each on its own partition
    slot: str
    trials_before: int
    trials_total: int
    wall_s: float
    stopped_by: str  # "trials", "time", "search space" or "already tuned"
    tasks: list[TaskResult] = field(default_factory=list)
    # After each measured batch: (seconds since this budget started, trials in the store, estimated
    # model latency in seconds once every task has a valid record, else None).
    history: list[tuple[float, int, float | None]] = field(default_factory=list)
    verification: list[Verification] = field(default_factory=list)
    clients: list[ClientReport] = field(default_factory=list)  # none when nothing was left to tune
    warm_from: str | None = None  # the budget (share key) whose tuning this one started from
    # The convolutions' layout tuned (`resaware.frontend.layout`); None: a plan's, a model without any, or unrecorded.
    layout: str | None = None
    caches: str | None = None  # how CPU candidates were timed, "flushed" or "warm" (`measure.Timing`)

    @property
    def measure_rate(self) -> float | None:
        """Candidates measured per second of measuring, summed over the clients measuring at once."""
        rates = [c.measure_rate for c in self.clients]
        return sum(rates) if rates and None not in rates else None

    @property
    def trials_run(self) -> int:
        """Trials this run added."""
        return self.trials_total - self.trials_before

    @property
    def estimated_s(self) -> float | None:
        """Sum of weight x best task latency, when every task has a record."""
        if not self.tasks or any(t.best_s is None for t in self.tasks):
            return None
        return sum(t.weight * t.best_s for t in self.tasks)


@dataclass
class TuneReport:
    """The result of `tune`: one BudgetResult per budget."""

    model: str
    hardware: str
    store: str
    budgets: list[BudgetResult]

    def to_json(self) -> dict:
        """Everything as JSON-ready data, derived figures included."""
        data = asdict(self)
        for result, raw in zip(self.budgets, data["budgets"]):
            raw["trials_run"] = result.trials_run
            raw["estimated_s"] = result.estimated_s
            raw["measure_rate"] = result.measure_rate
        return data

    @classmethod
    def from_json(cls, data: dict) -> TuneReport:
        """The report `to_json` (or `resaware tune --json`) wrote, to plot or compare later."""
        budgets = []
        for raw in data["budgets"]:
            fields = {k: v for k, v in raw.items() if k in BudgetResult.__dataclass_fields__}
            fields["tasks"] = [TaskResult(**t) for t in raw["tasks"]]
            fields["history"] = [tuple(h) for h in raw["history"]]
            fields["verification"] = [Verification(**v) for v in raw["verification"]]
            fields["clients"] = [ClientReport(**{**c, "window": tuple(c["window"])}) for c in raw["clients"]]
            budgets.append(BudgetResult(**fields))
        return cls(data["model"], data["hardware"], data["store"], budgets)

    def table(self) -> str:
        """A printable table: one line per budget."""
        layouts = ", ".join(sorted({b.layout for b in self.budgets if b.layout}))
        caches = "/".join(sorted({b.caches for b in self.budgets if b.caches}))
        how = ", ".join([*([f"{layouts} convolutions"] if layouts else []), *([f"caches {caches}"] if caches else [])])
        lines = [f"model {self.model}{f' ({how})' if how else ''} on {self.hardware}, store {self.store}",
                 f"{'budget':>7} {'cores':>6} {'clients':>7} {'trials':>13} {'tuned tasks':>11} {'est. latency':>13} {'wall':>8} {'re-measured':>25}  stopped by"]  # fmt: skip
        for b in self.budgets:
            tuned = sum(1 for t in b.tasks if t.best_s is not None)
            est = f"{b.estimated_s * 1e3:.2f} ms" if b.estimated_s is not None else "n/a"
            drift = f"{max(v.ratio for v in b.verification):.2f}x max" if b.verification else "-"
            beside = [v.concurrency_ratio for v in b.verification if v.concurrency_ratio is not None]
            drift += f", {statistics.median(beside):.2f}x together" if beside else ""
            lines.append(
                f"{b.budget:>7} {len(b.cores):>6} {b.concurrency:>7} {f'{b.trials_run}+{b.trials_before}={b.trials_total}':>13} "
                f"{f'{tuned}/{len(b.tasks)}':>11} {est:>13} {b.wall_s:>7.0f}s {drift:>25}  {b.stopped_by}"
                + (f"; warm start from {b.warm_from}" if b.warm_from else "")
            )
        return "\n".join(lines)
