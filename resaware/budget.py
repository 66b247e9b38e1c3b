"""A budget: the share of one device a model is tuned for and runs with.

A plain value: it imports no TVM and nothing else of resaware's. On a CPU it reads one thing from the
machine, which logical cores are SMT siblings (`/sys/devices/system/cpu`), so that partitions take whole
physical cores where they can.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

SYSFS_CPU = Path("/sys/devices/system/cpu")


class BudgetError(ValueError):
    """A budget that cannot be parsed or realised."""


@dataclass(frozen=True, order=True)
class Budget:
    """A fraction of one device, in (0, 1]."""

    fraction: float

    def __post_init__(self):
        f = self.fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or math.isnan(f) or not 0 < f <= 1:
            raise BudgetError(f"budget {f!r} is outside (0, 1]: give a fraction like 0.5 or a percent like 50%")
        object.__setattr__(self, "fraction", float(f))

    @classmethod
    def parse(cls, value: Budget | float | int | str) -> Budget:
        """Read `0.5`, `"50%"` or `"50"`: a bare number <= 1 is a fraction, > 1 a percent."""
        if isinstance(value, Budget):
            return value
        text = str(value).strip()
        percent = text.endswith("%")
        try:
            number = float(text[:-1] if percent else text)
        except ValueError:
            raise BudgetError(
                f"budget {value!r} is not a number: give a fraction like 0.5 or a percent like 50%"
            ) from None
        if math.isnan(number) or math.isinf(number):
            raise BudgetError(
                f"budget {value!r} is not a finite number: give a fraction like 0.5 or a percent like 50%"
            )
        if percent or number > 1:
            number /= 100.0
        if not 0 < number <= 1:
            raise BudgetError(f"budget {value!r} is outside (0%, 100%]: give a fraction like 0.5 or a percent like 50%")
        return cls(number)

    @classmethod
    def parse_list(cls, text: str) -> list[Budget]:
        """Read a comma-separated list (`"50%,100%"`), keeping order and dropping repeats."""
        budgets = [cls.parse(part) for part in str(text).split(",") if part.strip()]
        if not budgets:
            raise BudgetError(f"no budget in {text!r}: give e.g. 50%,100%")
        return list(dict.fromkeys(budgets))

    @property
    def percent(self) -> float:
        """The fraction as a percentage."""
        return self.fraction * 100.0

    def __str__(self) -> str:
        return f"{self.percent:g}%"

    def core_count(self, usable: int) -> int:
        """Cores this budget realises on a CPU with `usable` cores: max(1, round-half-up(f x usable))."""
        if usable < 1:
            raise BudgetError("no usable CPU cores in this process's affinity")
        exact = Decimal(repr(self.fraction)) * usable
        return max(1, min(usable, int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))))

    def cpu(self, usable_cores: list[int] | tuple[int, ...], partition: int = 0) -> CpuShare:
        """The concrete core set of one partition: partition 0 is the highest-numbered cores, 1 the
        ones below them, and so on (so a lone tuner keeps the low ones). With SMT, cores are counted by
        physical core (`physical_order`): partitions as large as a physical core take whole ones, smaller
        ones take one thread of each physical core before any takes a second."""
        usable = tuple(sorted(usable_cores))
        n = self.core_count(len(usable))
        if not 0 <= partition < len(usable) // n:
            raise BudgetError(
                f"budget {self} has partitions 0..{len(usable) // n - 1} on {len(usable)} cores, not {partition}"
            )
        order = physical_order(usable, n)
        end = len(usable) - partition * n
        return CpuShare(asked=self, cores=tuple(sorted(order[end - n : end])), usable=usable)

    @property
    def mps_clients(self) -> int:
        """Concurrent CUDA MPS clients at this budget: floor(1 / fraction)."""
        return max(1, math.floor(1 / self.fraction + 1e-9))

    @property
    def mps_percentage(self) -> int:
        """`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` for this budget (1..100)."""
        return max(1, min(100, int(Decimal(repr(self.percent)).quantize(Decimal(1), rounding=ROUND_HALF_UP))))


def smt_siblings(core: int) -> frozenset[int]:
    """The logical cores on `core`'s physical core, itself included (itself alone where the kernel does
    not say: no sysfs, or no SMT)."""
    try:
        text = (SYSFS_CPU / f"cpu{core}" / "topology" / "thread_siblings_list").read_text()
        cores = set()
        for part in text.strip().split(","):
            first, _, last = part.partition("-")
            cores.update(range(int(first), int(last or first) + 1))
    except (OSError, ValueError):
        return frozenset({core})
    return frozenset(cores | {core})


def sibling_groups(cores) -> dict[int, list[int]]:
    """Each of `cores` with its SMT siblings among `cores`, itself included, ascending: one group per
    physical core that `cores` reach."""
    cores = set(cores)
    return {c: sorted(smt_siblings(c) & cores) for c in cores}


def physical_order(cores, size: int) -> tuple[int, ...]:
    """`cores` in the order partitions of `size` are cut from (from the end). At least a physical core's
    size: siblings next to each other, physical cores by their lowest logical number, those with all their
    threads in `cores` last. Smaller: each physical core's first thread before any core's second. Without
    SMT, ascending order either way."""
    groups = sibling_groups(cores)
    widest = max(map(len, groups.values()), default=1)

    def key(core: int) -> tuple[int, ...]:
        group = groups[core]
        physical, thread = group[0], group.index(core)
        return (len(group) == widest, physical, thread) if size >= widest else (thread, physical)

    return tuple(sorted(groups, key=key))


def apart_from(cores, measuring) -> tuple[int, ...]:
    """Those of `cores` on no physical core that `measuring` uses: what runs there does not share a
    core's execution units or L1/L2 with a timing."""
    busy = set().union(*(smt_siblings(c) for c in measuring))
    return tuple(c for c in cores if c not in busy)


@dataclass(frozen=True)
class CpuShare:
    """A budget realised on a CPU: the cores that measure or run, out of the usable ones."""

    asked: Budget
    cores: tuple[int, ...]
    usable: tuple[int, ...]

    @property
    def count(self) -> int:
        """Cores in the share."""
        return len(self.cores)

    @property
    def fraction(self) -> float:
        """Realised fraction of the usable cores."""
        return self.count / len(self.usable)

    @property
    def realised(self) -> Budget:
        """The budget this share really is (`75%` of 2 cores realises 100%)."""
        return Budget(self.fraction)

    @property
    def max_concurrency(self) -> int:
        """How many disjoint partitions of this size the usable cores hold."""
        return len(self.usable) // self.count

    def partitions(self, k: int) -> list[CpuShare]:
        """Partitions 0..k-1 of this budget: `k` disjoint shares of this size."""
        if not 1 <= k <= self.max_concurrency:
            raise BudgetError(
                f"budget {self.asked} ({self.count} of {len(self.usable)} cores) allows concurrency "
                f"1..{self.max_concurrency}, not {k}"
            )
        return [self.asked.cpu(self.usable, i) for i in range(k)]

    def spare(self, k: int) -> tuple[int, ...]:
        """Usable cores outside the first `k` partitions: builds and search can go there."""
        taken = {c for p in self.partitions(k) for c in p.cores}
        return tuple(c for c in self.usable if c not in taken)

    @property
    def rest(self) -> tuple[int, ...]:
        """Usable cores outside the share: where the tuner's own work can go."""
        return tuple(c for c in self.usable if c not in self.cores)

    @property
    def key(self) -> str:
        """Store key of the realised share, e.g. `cpu-1of2`."""
        return f"cpu-{self.count}of{len(self.usable)}"

    def describe(self) -> str:
        """`asked → c of n cores`, as announced to the user."""
        return f"{self.asked} → {self.count} of {len(self.usable)} cores"

    @property
    def exact(self) -> bool:
        """Whether the share realises exactly the budget asked for."""
        return math.isclose(self.fraction, self.asked.fraction, rel_tol=1e-9)


_said: set[tuple] = set()


def announce(share: CpuShare, stream=None) -> None:
    """Say once per process when a budget maps to another share than asked."""
    marker = (share.asked, share.count, len(share.usable))
    if not share.exact and marker not in _said:
        _said.add(marker)
        print(f"resaware: budget {share.describe()} ({share.fraction:.0%} realised)", file=stream or sys.stderr)
