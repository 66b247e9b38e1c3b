"""GPU budgets without a GPU: the MPS environment a budget produces, the private daemon, green contexts."""

from __future__ import annotations

import pytest

from resaware.budget import Budget
from resaware.errors import ResawareError
from resaware.platform import mps


def test_client_environment_names_the_private_daemon_and_the_percentage(tmp_path):
    env = mps.client_environment("25%", tmp_path / "pipe", tmp_path / "log")
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log"),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    assert mps.client_environment(0.333, "p", "l")["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "33"
    assert mps.client_environment("100%", "p", "l")["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"


def test_daemon_is_private_never_the_system_one(tmp_path):
    daemon = mps.MpsDaemon(tmp_path / "mps")
    env = daemon.control_env()
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "pipe")
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "mps" / "log")
    assert daemon.start_command()[-1] == "-d"  # background daemon, controlled through our pipe only
    client = daemon.client_env("50%")
    assert client["CUDA_MPS_PIPE_DIRECTORY"] == env["CUDA_MPS_PIPE_DIRECTORY"]
    assert client["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    fresh, other = mps.MpsDaemon(), mps.MpsDaemon()
    assert fresh.root.name.startswith("resaware-mps-") and fresh.root != other.root
    for daemon in (fresh, other):  # its own temporary directory goes with it; a given one stays
        daemon.stop()
        assert not daemon.root.exists()
    daemon = mps.MpsDaemon(tmp_path / "given")
    daemon.stop()
    assert daemon.root == tmp_path / "given"


def test_concurrency_is_floor_of_one_over_the_budget():
    assert [Budget.parse(b).mps_clients for b in ("25%", "30%", "50%", "100%")] == [4, 3, 2, 1]


@pytest.mark.skipif(mps.binary() is not None, reason="MPS is installed here")
def test_without_mps_start_says_why_and_what_remains(tmp_path):
    with pytest.raises(mps.MpsUnavailable) as caught:
        mps.MpsDaemon(tmp_path).start()
    message = str(caught.value)
    assert "nvidia-cuda-mps-control is not installed" in message and "whole GPU (100%)" in message
    assert isinstance(caught.value, ResawareError)


def test_green_context_sms_follow_the_architecture_granularity():
    # Hopper (H100/H200, 132 SMs): at least 8 SMs, in multiples of 8.
    assert mps.green_context_sms("25%", 132, "sm_90").sms == 32
    assert mps.green_context_sms("50%", 132, "sm_90").sms == 64
    assert mps.green_context_sms("5%", 132, "sm_90").sms == 8  # the minimum, more than asked
    assert mps.green_context_sms("100%", 132, "sm_90").sms == 132  # the whole GPU needs no partition
    # Ampere (A100, 108 SMs): at least 4, in multiples of 2.
    a100 = mps.green_context_sms("50%", 108, "sm_80")
    assert (a100.sms, a100.min_count, a100.multiple) == (54, 4, 2)
    assert a100.fraction == pytest.approx(0.5)
