import math
import os
import subprocess
import sys

import pytest

from resaware.budget import Budget, BudgetError, announce


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
        "from resaware import confine; from resaware.budget import Budget;"
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
