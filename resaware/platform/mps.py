"""GPU budgets: a private CUDA MPS daemon, and CUDA green contexts where MPS cannot start.

A CUDA budget of f is `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` = round(100 f) for each client process, and
floor(1/f) such clients share the GPU at once, as the CPU partitions do. resaware starts its own MPS
control daemon with its own pipe and log directories (`CUDA_MPS_PIPE_DIRECTORY`,
`CUDA_MPS_LOG_DIRECTORY`), so it never talks to, nor stops, a system-wide daemon. Plain Python: no TVM.

Where MPS cannot start (no `nvidia-cuda-mps-control`, no permission, a GPU in exclusive mode owned by
someone else), the driver's green contexts (`cuGreenCtxCreate`, CUDA 12.4+) partition SMs instead, in
counts `green_context_sms` gives per budget. They do not confine TVM's kernels, though: TVM's CUDA
runtime makes the primary context current (`cudaSetDevice`) before it allocates or launches (measured
on an H200: a 32-SM green context ran as fast as the whole GPU). So without MPS resaware measures the
whole GPU (100%) only, and says so.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from resaware.budget import Budget
from resaware.errors import ResawareError

_SEARCH = ("/usr/bin", "/usr/local/nvidia/bin", "/usr/local/cuda/bin")


class MpsUnavailable(ResawareError):
    """MPS cannot run here; the message says why and what to do instead."""


def binary() -> str | None:
    """`nvidia-cuda-mps-control` on PATH or in the driver's usual directories."""
    found = shutil.which("nvidia-cuda-mps-control")
    for directory in _SEARCH:
        if not found and os.access(os.path.join(directory, "nvidia-cuda-mps-control"), os.X_OK):
            found = os.path.join(directory, "nvidia-cuda-mps-control")
    return found


def client_environment(budget: Budget | str | float, pipe_dir: str | os.PathLike, log_dir: str | os.PathLike) -> dict:
    """The variables that make a CUDA process an MPS client of the daemon at `pipe_dir`, at `budget`."""
    return {
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir),
        "CUDA_MPS_LOG_DIRECTORY": str(log_dir),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(Budget.parse(budget).mps_percentage),
    }


class MpsDaemon:
    """A private MPS control daemon: `with MpsDaemon() as mps: env = mps.client_env("25%")`."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.owns_root = root is None  # a temporary directory of ours, removed on stop
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="resaware-mps-"))
        self.pipe_dir = self.root / "pipe"
        self.log_dir = self.root / "log"
        self.started = False

    def control_env(self) -> dict:
        """The environment the control daemon and its control commands run with."""
        return {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def start_command(self) -> list[str]:
        """The command line that starts the daemon (in the background, `-d`)."""
        return [binary() or "nvidia-cuda-mps-control", "-d"]

    def control(self, command: str, timeout: float = 10.0) -> str:
        """Send one control command (`get_server_list`, `quit`, ...) and return its answer."""
        done = subprocess.run(
            [binary() or "nvidia-cuda-mps-control"], input=command + "\n", env=self.control_env(),
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        return done.stdout.strip()

    def start(self) -> MpsDaemon:
        """Start the daemon and check that it answers; `MpsUnavailable` says why not."""
        if binary() is None:
            raise MpsUnavailable(
                "MPS is not available: nvidia-cuda-mps-control is not installed (it comes with the NVIDIA "
                "driver); without it only the whole GPU (100%) can be measured, since green contexts do not "
                "confine TVM's kernels"
            )
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(self.start_command(), env=self.control_env(), capture_output=True, text=True,
                                  timeout=30)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as error:
            self.started = True  # it may have started: stop() sends quit to our pipe only
            self.stop()
            raise MpsUnavailable(f"MPS control daemon did not start ({error}); without MPS only the whole GPU "
                                 "(100%) can be measured") from None  # fmt: skip
        if done.returncode != 0:
            raise MpsUnavailable(
                f"MPS control daemon did not start (exit {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[:200] or 'no message'}); see {self.log_dir}/control.log; "
                "without MPS only the whole GPU (100%) can be measured"
            )
        self.started = True
        deadline = time.monotonic() + 10
        while not (self.pipe_dir / "control").exists():
            if time.monotonic() > deadline:
                self.stop()
                raise MpsUnavailable(
                    f"MPS control daemon started but made no control pipe in {self.pipe_dir}: "
                    f"{self.log_tail() or 'no log'}"
                )
            time.sleep(0.05)
        return self

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the daemon's control log."""
        path = self.log_dir / "control.log"
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) if path.exists() else ""

    def client_env(self, budget: Budget | str | float) -> dict:
        """The variables a client process at `budget` needs (add them to its environment)."""
        return client_environment(budget, self.pipe_dir, self.log_dir)

    def servers(self) -> list[int]:
        """PIDs of the MPS servers this daemon runs (one appears once a client has connected); none if it
        does not answer."""
        try:
            return [int(p) for p in self.control("get_server_list").split() if p.isdigit()]
        except (OSError, subprocess.TimeoutExpired):
            return []

    def stop(self) -> None:
        """Stop this daemon (and its server); never touches any other daemon."""
        if self.started:
            try:
                self.control("quit")
            except (OSError, subprocess.TimeoutExpired):
                pass
            self.started = False
        if self.owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> MpsDaemon:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass(frozen=True)
class GreenContextShare:
    """A budget realised as a green context: `sms` of the GPU's `total` SMs."""

    asked: Budget
    sms: int
    total: int
    min_count: int
    multiple: int

    @property
    def fraction(self) -> float:
        """The realised share of the SMs."""
        return self.sms / self.total


def sm_granularity(arch: str) -> tuple[int, int]:
    """(minimum SMs, multiple) of a green context's SM partition on `arch` (CUDA driver API docs)."""
    major = int(str(arch).lower().removeprefix("sm_").rstrip("af")[:-1] or 0)
    if major >= 9:
        return 8, 8
    if major == 8:
        return 4, 2
    if major == 7:
        return 2, 2
    return 1, 1


def green_context_sms(budget: Budget | str | float, total_sms: int, arch: str) -> GreenContextShare:
    """The SM count a green context realises `budget` with: f x SMs rounded down to the granularity,
    at least the minimum (so small budgets may realise more than asked)."""
    budget = Budget.parse(budget)
    min_count, multiple = sm_granularity(arch)
    if budget.fraction == 1.0:  # the whole GPU: no partition, so no rounding
        return GreenContextShare(budget, total_sms, total_sms, min_count, multiple)
    sms = max(min_count, math.floor(budget.fraction * total_sms / multiple + 1e-9) * multiple)
    return GreenContextShare(budget, min(sms, total_sms), total_sms, min_count, multiple)
