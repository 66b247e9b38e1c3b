import math
import os
import subprocess
import sys

import pytest

from resaware import budget
from resaware.budget import Budget, BudgetError, announce


@pytest.fixture(autouse=True)
def no_smt(tmp_path_factory, monkeypatch):
    """A host without SMT, whatever this one is (tests of SMT hosts draw their own topology)."""
    monkeypatch.setattr(budget, "SYSFS_CPU", tmp_path_factory.mktemp("no-topology"))


@pytest.mark.parametrize(
    "text, fraction",
    [
        ("0.5", 0.5),
        (0.5, 0.5),
        ("50%", 0.5),
        ("50", 0.5),
        (1, 1.0),
        ("1", 1.0),
        ("100%", 1.0),
        ("12.5%", 0.125),
        (" 75% ", 0.75),
        ("1.5", 0.015),
    ],
)
def test_parse(text, fraction):
    assert math.isclose(Budget.parse(text).fraction, fraction)


@pytest.mark.parametrize("bad", ["0", "0%", "-1", "101", "150%", "nan", "inf", "abc", "", "50%%"])
def test_parse_rejects(bad):
    with pytest.raises(BudgetError) as error:
        Budget.parse(bad)
    assert "budget" in str(error.value) and ("fraction" in str(error.value) or "percent" in str(error.value))


def test_constructor_checks_range():
    with pytest.raises(BudgetError):
        Budget(float("nan"))
    with pytest.raises(BudgetError):
        Budget(1.01)


def test_parse_list_keeps_order_and_drops_repeats():
    assert [str(b) for b in Budget.parse_list("100%,50%,0.5")] == ["100%", "50%"]
    with pytest.raises(BudgetError):
        Budget.parse_list(" , ")


@pytest.mark.parametrize(
    "fraction, usable, cores",
    [
        (0.5, 2, 1),
        (1.0, 2, 2),
        (0.75, 2, 2),
        (0.25, 2, 1),
        (0.1, 2, 1),
        (0.3, 5, 2),
        (0.5, 1, 1),
        (0.25, 16, 4),
        (0.125, 4, 1),
        (0.625, 4, 3),
    ],
)
def test_core_count_rounds_half_up(fraction, usable, cores):
    assert Budget(fraction).core_count(usable) == cores


def test_share_takes_highest_cores_and_leaves_rest_to_tuner():
    share = Budget(0.5).cpu([0, 1, 2, 3])
    assert share.cores == (2, 3) and share.rest == (0, 1)
    assert share.key == "cpu-2of4" and share.exact
    full = Budget(0.75).cpu([0, 1])
    assert full.cores == (0, 1) and full.rest == () and not full.exact
    assert full.describe() == "75% → 2 of 2 cores"


def test_announce_once(capsys):
    share = Budget(0.7).cpu([0, 1])
    announce(share)
    announce(share)
    err = capsys.readouterr().err
    assert err.count("70% → 1 of 2 cores") == 1


def test_mps_percentage():
    assert Budget(0.3).mps_percentage == 30
    assert Budget(0.005).mps_percentage == 1
    assert Budget(1.0).mps_percentage == 100


def test_process_restricted_to_one_core_maps_every_budget_to_it():
    code = (
        "from resaware.platform import confine; from resaware.budget import Budget;"
        "u = confine.usable_cores(); print(len(u), Budget.parse('50%').cpu(u).cores == tuple(u), Budget.parse('100%').cpu(u).key)"
    )
    core = min(os.sched_getaffinity(0))
    out = subprocess.run(
        ["taskset", "-c", str(core), sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["1", "True", "cpu-1of1"]


def test_partitions_are_disjoint_and_leave_the_rest_spare():
    share = Budget(0.3).cpu(range(16))  # 5 cores: three partitions, one core over
    parts = share.partitions(3)
    assert share.max_concurrency == 3 and parts[0] == share
    assert [p.cores for p in parts] == [(11, 12, 13, 14, 15), (6, 7, 8, 9, 10), (1, 2, 3, 4, 5)]
    assert share.spare(3) == (0,) and share.spare(1) == tuple(range(11))
    assert Budget(0.5).cpu([0, 1], partition=1).cores == (0,)
    with pytest.raises(BudgetError, match="concurrency 1..3"):
        share.partitions(4)
    with pytest.raises(BudgetError, match="partitions 0..1"):
        Budget(0.5).cpu([0, 1], partition=2)


def test_mps_clients_is_floor_of_one_over_the_fraction():
    assert [Budget(f).mps_clients for f in (1.0, 0.5, 0.3, 0.25, 1 / 3, 0.7)] == [1, 2, 3, 4, 3, 1]


def _smt_host(root, siblings: list[str]) -> None:
    """A sysfs cpu tree whose core i has `siblings[i]` as its thread_siblings_list."""
    for core, text in enumerate(siblings):
        topology = root / f"cpu{core}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(text + "\n")


def test_partitions_take_whole_physical_cores_on_an_smt_host(tmp_path, monkeypatch):
    # Linux numbers SMT siblings apart: 8 logical cores, physical core p holds p and p + 4.
    _smt_host(tmp_path, [f"{p},{p + 4}" for p in range(4)] * 2)
    monkeypatch.setattr(budget, "SYSFS_CPU", tmp_path)
    assert budget.smt_siblings(6) == {2, 6}
    half = Budget(0.5).cpu(range(8))  # 4 cores: two whole physical cores, not 4-7 (one thread of each)
    assert half.cores == (2, 3, 6, 7) and [p.cores for p in half.partitions(2)] == [(2, 3, 6, 7), (0, 1, 4, 5)]
    assert half.spare(1) == (0, 1, 4, 5) and half.key == "cpu-4of8"
    # Smaller than a physical core: each partition on a physical core of its own while there are enough.
    one = Budget(1 / 8).cpu(range(8))
    assert [p.cores for p in one.partitions(4)] == [(7,), (6,), (5,), (4,)]
    # The tuner's work goes nowhere near a timed core's sibling.
    assert budget.apart_from(one.spare(1), one.cores) == (0, 1, 2, 4, 5, 6)
    # An affinity holding one thread of physical core 1: the whole core 0 is the share, core 1 the tuner's.
    assert Budget(0.5).cpu([0, 1, 4]).cores == (0, 4) and budget.apart_from([1], (0, 4)) == (1,)


def test_partitions_with_siblings_numbered_side_by_side(tmp_path, monkeypatch):
    _smt_host(tmp_path, [f"{c - c % 2}-{c - c % 2 + 1}" for c in range(8)])  # 0-1, 2-3, ...
    monkeypatch.setattr(budget, "SYSFS_CPU", tmp_path)
    one = Budget(1 / 8).cpu(range(8))
    assert [p.cores for p in one.partitions(4)] == [(7,), (5,), (3,), (1,)]  # one physical core each
    assert [p.cores for p in Budget(0.25).cpu(range(8)).partitions(4)] == [(6, 7), (4, 5), (2, 3), (0, 1)]


def test_sibling_lists_in_ranges_and_hosts_without_smt(tmp_path, monkeypatch):
    _smt_host(tmp_path, ["0-1", "0-1", "2-3", "2-3"])
    monkeypatch.setattr(budget, "SYSFS_CPU", tmp_path)
    assert Budget(0.5).cpu(range(4)).cores == (2, 3) and Budget(0.25).cpu(range(4)).partitions(2)[1].cores == (1,)
    (tmp_path / "cpu3/topology/thread_siblings_list").write_text("\n")  # unreadable: counted alone
    assert budget.smt_siblings(3) == {3}
    monkeypatch.setattr(budget, "SYSFS_CPU", tmp_path / "absent")  # no topology: each core its own
    assert budget.smt_siblings(3) == {3} and Budget(0.5).cpu(range(4)).cores == (2, 3)
    assert budget.apart_from((0, 1, 2), (2,)) == (0, 1)
