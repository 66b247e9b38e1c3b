"""Many machines through TVM's RPC tracker: `resaware serve` and `tune(..., tracker=...)` on loopback."""

import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import two_cores

import resaware
from resaware import ResawareError
from resaware.budget import Budget
from resaware.platform import hardware
from resaware.store import Store
from resaware.tuning import remote


def _serve(tracker, budget="50%", *extra):
    """A `resaware serve` process and the line it prints once it is registered."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "resaware.cli", "serve", "--tracker", tracker, "--budget", budget, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    ready, _, _ = select.select([proc.stdout], [], [], 120)  # a line once registered, or EOF if it failed
    line = proc.stdout.readline() if ready else ""
    return proc, line


def _stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def tracker():
    from tvm.rpc.tracker import Tracker

    tracker = Tracker(host="127.0.0.1", port=9190, port_end=9290, silent=True)
    yield f"127.0.0.1:{tracker.port}"
    tracker.terminate()


@two_cores
def test_two_servers_register_under_budget_keys_on_disjoint_partitions(tracker, small_model, tmp_path):
    servers = [_serve(tracker) for _ in range(2)]
    try:
        for proc, line in servers:
            assert line.startswith("serving budget 50% on cores"), proc.stderr.read() if proc.poll() else line
        name = f"resaware.{hardware.detect().id}.cpu-1of2"
        assert remote.find_servers(tracker, Budget.parse("50%"), wait_s=30, settle_s=1) == {name: 2}
        with pytest.raises(ResawareError, match="no server registered"):
            remote.find_servers(tracker, Budget.parse("100%"), wait_s=1)
        # Both partitions are claimed: a third server at 50% (or one at 100%) is refused in one line.
        third, _ = _serve(tracker, "100%")
        assert third.wait(timeout=60) == 2 and "held by another `resaware serve`" in third.stderr.read()
        cores = sorted(tuple(remote.server_info(tracker, name)["cores"]) for _ in range(4))
        assert set(cores) <= {(0,), (1,)}

        report = resaware.tune(small_model, "50%", trials=16, store=tmp_path, progress=False, tracker=tracker)
        (result,) = report.budgets
        assert result.trials_total >= 16 and result.concurrency == 2 and result.stopped_by == "trials"
        assert all(t.best_s is not None for t in result.tasks) and result.verification
        (slot,) = Store.open(tmp_path).slots()
        # Stored under the server's fingerprint (the one in its key), at the server's share.
        assert slot.hardware.id == name.split(".")[1] and slot.key == "cpu-1of2"
        assert len(slot.record_file.read_text().splitlines()) == result.trials_total
    finally:
        for proc, _ in servers:
            _stop(proc)


@two_cores
def test_a_server_killed_mid_run_costs_only_its_trials(tracker, small_model, tmp_path):
    servers = [_serve(tracker) for _ in range(2)]
    records = None

    def kill_after_first_batch():
        while records is None:
            time.sleep(0.2)
        deadline = time.time() + 120
        while time.time() < deadline and not (records.exists() and records.read_text().strip()):
            time.sleep(0.2)
        os.killpg(servers[1][0].pid, signal.SIGKILL)

    try:
        assert all(line.startswith("serving") for _, line in servers)
        hw = hardware.detect()
        records = tmp_path / hw.id / "llvm" / "cpu-1of2" / "database_tuning_record.json"
        killer = threading.Thread(target=kill_after_first_batch, daemon=True)
        killer.start()
        report = resaware.tune(small_model, "50%", trials=20, store=tmp_path, progress=False, tracker=tracker)
        killer.join(timeout=5)
        assert servers[1][0].poll() is not None  # it really died while tuning went on
        (result,) = report.budgets
        assert result.trials_total >= 20 and result.stopped_by == "trials"
        (slot,) = Store.open(tmp_path).slots()
        lines = slot.record_file.read_text().splitlines()
        failed = sum(1 for r in slot.database().get_all_tuning_records() if max(float(s) for s in r.run_secs) >= 1e9)
        assert len(lines) == result.trials_total and failed <= 4  # at most what was in flight on it
    finally:
        for proc, _ in servers:
            _stop(proc)


def test_serve_warns_off_loopback_and_refuses_bad_addresses(tracker):
    proc, line = _serve(tracker, "50%", "--host", "0.0.0.0", "--port", "9390")
    try:
        assert line.startswith("serving")
    finally:
        _stop(proc)
    warning = proc.stderr.read()
    assert "WARNING: serving on 0.0.0.0" in warning and "trusted networks only" in warning
    with pytest.raises(ResawareError, match="HOST:PORT"):
        remote.parse_address("nohost")
    with pytest.raises(ResawareError, match="HOST:PORT"):
        resaware.tune("zoo:squeezenet", "50%", trials=1, tracker="localhost:99999")


def test_keys_name_hardware_and_share():
    share = Budget.parse("50%").cpu([0, 1, 2, 3])
    hw = hardware.detect()
    key = remote.key(hw, share)
    assert key == f"resaware.{hw.id}.cpu-2of4" and remote.parse_key(key) == (hw.id, 2, 4)
    assert remote.parse_key("other.key") is None
