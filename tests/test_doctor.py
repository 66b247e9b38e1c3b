"""`resaware doctor` on this machine: CPU, the budgets it realises, GPU (none here), nvcc, TVM."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli

from resaware.budget import Budget
from resaware.platform import confine, cuda


def test_doctor_reports_what_this_machine_can_do():
    done = run_cli("doctor")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    labels = [line.split()[0] for line in lines if line and not line.startswith(" ")]
    assert labels == ["CPU", "GPU", "TVM", "nvcc"]
    usable = confine.usable_cores()
    assert f"{len(usable)} usable" in done.stdout
    # Physical cores told apart another way than resaware does: by (package, die, core id), where sysfs says.
    ids = ("physical_package_id", "die_id", "core_id")
    physical = {tuple(f.read_text() for i in ids if (f := Path(f"/sys/devices/system/cpu/cpu{c}/topology/{i}")).exists())
                for c in usable}  # fmt: skip
    if all(physical):
        assert f"on {len(physical)} physical core" in done.stdout
    for text in ("50%", "100%"):
        share = Budget.parse(text).cpu(usable)
        assert f"{text} -> {share.count} core" in done.stdout and f"x{share.max_concurrency} at once" in done.stdout
    assert "USE_CUDA=ON" in done.stdout
    if cuda.detect() is None:
        assert "GPU        none" in done.stdout and "sm_90" in done.stdout
    else:
        assert "MPS" in done.stdout and "SMs" in done.stdout
    if cuda.nvcc_path() is None:
        assert "nvcc       not found" in done.stdout
    else:
        assert "nvcc       " + cuda.nvcc_path() in done.stdout
