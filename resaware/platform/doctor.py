"""`resaware doctor`: what this machine can do, and the budgets it can realise."""

from __future__ import annotations

import os
import subprocess

from resaware.budget import Budget, sibling_groups
from resaware.platform import confine, mps

_FRACTIONS = ("25%", "50%", "75%", "100%")


def _nvcc() -> str:
    from resaware.platform.cuda import nvcc_path

    path = nvcc_path()
    if path is None:
        return "not found (CUDA kernels cannot be built here)"
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        release = [line for line in done.stdout.splitlines() if "release" in line]
        return f"{path} ({release[-1].split(',')[-1].strip() if release else 'version unknown'})"
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{path} (does not run: {error})"


def _cpu_lines() -> list[str]:
    from resaware.platform import hardware

    hw = hardware.detect()
    usable = confine.usable_cores()
    lines = [
        f"CPU        {hw.cpu_model} (LLVM mcpu {hw.mcpu}, {hw.machine})",
        f"  ISA      {' '.join(hw.isa) or 'none of the extensions resaware keys on'}",
        f"  cores    {len(usable)} usable (this process's affinity: {usable}) on {_physical(usable)}; "
        f"{os.cpu_count()} in the machine",
        "  budgets  " + "; ".join(_cpu_budget(f, usable) for f in _FRACTIONS),
    ]
    return lines


def _physical(usable: list[int]) -> str:
    physical = len({group[0] for group in sibling_groups(usable).values()})
    return f"{physical} physical core{'s' * (physical > 1)}" + (" (SMT)" if physical < len(usable) else "")


def _cpu_budget(text: str, usable: list[int]) -> str:
    share = Budget.parse(text).cpu(usable)
    exact = "" if share.exact else f" = {share.fraction:.0%}"
    return f"{text} -> {share.count} core{'s' * (share.count > 1)}{exact}, x{share.max_concurrency} at once"


def _gpu_lines() -> list[str]:
    from resaware.platform import cuda

    try:
        driver = cuda.load_runtime()
        gpu = cuda.detect()
    except Exception as error:  # no CUDA runtime at all
        return [f"GPU        none usable ({str(error).splitlines()[0][:160]})"]
    if gpu is None:
        why = "no NVIDIA driver" if not driver else "the driver sees no device"
        return [
            f"GPU        none ({why}): CUDA kernels are built for {cuda.DEFAULT_ARCH} unless --arch says otherwise, "
            "and measured where the GPU is (`resaware candidates`)",
            f"  MPS      {'nvidia-cuda-mps-control at ' + mps.binary() if mps.binary() else 'not installed'}",
        ]
    lines = [
        f"GPU        {gpu.name}: {gpu.arch}, {gpu.sms} SMs, {gpu.max_shared_memory_per_block // 1024} KiB shared/block"
    ]
    lines.append("  MPS      " + _mps_state())
    green = mps.sm_granularity(gpu.arch)
    lines.append(f"  green    SM partitions of at least {green[0]}, in multiples of {green[1]} (not used: TVM's runtime "
                 "makes the primary context current before it launches)")  # fmt: skip
    budgets = []
    for text in _FRACTIONS:
        b = Budget.parse(text)
        share = mps.green_context_sms(b, gpu.sms, gpu.arch)
        budgets.append(f"{text} -> MPS {b.mps_percentage}% x{b.mps_clients} clients (green: {share.sms} SMs)")
    lines.append("  budgets  " + "; ".join(budgets))
    return lines


def _mps_state() -> str:
    """Whether a private MPS daemon starts here (started and stopped at once)."""
    if mps.binary() is None:
        return "not installed: only the whole GPU (100%) can be measured (green contexts do not confine TVM's kernels)"
    try:
        with mps.MpsDaemon() as daemon:
            return f"a private daemon starts ({mps.binary()}; pipe {daemon.pipe_dir})"
    except mps.MpsUnavailable as error:
        return str(error)


def _tvm_lines() -> list[str]:
    import tvm

    info = tvm.support.libinfo()
    flags = ", ".join(f"{k}={info[k]}" for k in ("USE_LLVM", "USE_CUDA", "USE_CUDNN", "USE_NVTX") if k in info)
    mode = os.environ.get("TVM_CUDA_COMPILE_MODE", "nvcc (resaware's default)")
    return [f"TVM        {tvm.__version__} ({flags}); CUDA compiles with {mode}", f"nvcc       {_nvcc()}"]


def report() -> str:
    """The whole report, one fact a line."""
    return "\n".join(_cpu_lines() + _gpu_lines() + _tvm_lines())
