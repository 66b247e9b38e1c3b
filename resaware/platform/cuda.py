"""CUDA: the target of a GPU budget, and kernels built with nvcc on a machine without a GPU.

TVM's CUDA codegen compiles kernels only when its CUDA runtime library (`libtvm_runtime_cuda.so`)
loads, and that library links the driver (`libcuda.so.1`). On a machine with nvcc but no driver TVM
keeps the raw CUDA source instead and compiles it when the module is loaded, on the GPU machine.
`prepare_build` stands in for the missing driver with a stub whose nine entry points all answer "no
device" (compiled here from `nodriver.c`), so the runtime library loads and TVM's compile callback
runs nvcc at build time: the module carries a fatbin for the named arch, and the GPU machine needs no
compiler. With no GPU the arch defaults to `sm_90` (H100/H200); TVM alone would fall back to `sm_50`,
which CUDA 13 no longer builds.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from resaware.errors import ResawareError, last_line

DEFAULT_ARCH = "sm_90"
_STUB_SOURCE = Path(__file__).with_name("nodriver.c")


@dataclass(frozen=True)
class Gpu:
    """One CUDA device as the driver reports it."""

    name: str
    sms: int
    arch: str  # sm_XY
    max_threads_per_block: int
    max_shared_memory_per_block: int
    warp_size: int


def _real_driver() -> bool:
    try:
        return hasattr(ctypes.CDLL("libcuda.so.1"), "cuInit")  # the stub has no cuInit
    except OSError:
        return False


def nvcc_path() -> str | None:
    """nvcc on PATH or under `$CUDA_HOME` / `/usr/local/cuda`, as TVM looks for it."""
    found = shutil.which("nvcc")
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if not found and home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            found = os.path.join(home, "bin", "nvcc")
    return found


def _stub_library() -> Path:
    """The stand-in driver, compiled once per source version into the user's cache."""
    source = _STUB_SOURCE.read_bytes()
    cache_dir = Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "resaware"
    library = cache_dir / f"nodriver-{hashlib.sha256(source).hexdigest()[:12]}" / "libcuda.so.1"
    if not library.exists():
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise ResawareError(
                "no CUDA driver here and no C compiler to build resaware's stand-in for it: install gcc, "
                "or build on a machine with the NVIDIA driver"
            )
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(f".{os.getpid()}")
        done = subprocess.run(
            [compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(partial), str(_STUB_SOURCE)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            raise ResawareError(f"could not build resaware's stand-in CUDA driver with {compiler}: "
                                f"{last_line(done.stderr or f'exit code {done.returncode}')}")  # fmt: skip
        os.replace(partial, library)
    return library


@cache
def load_runtime() -> bool:
    """Load TVM's CUDA runtime library into this process (with the stand-in driver if there is no real
    one); True if a real driver is present."""
    driver = _real_driver()
    if not driver:
        ctypes.CDLL(str(_stub_library()), mode=ctypes.RTLD_GLOBAL)
    import tvm
    import tvm_ffi

    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        runtime = Path(tvm.base._LOADED_LIBS["tvm_runtime"]._name).resolve().parent / "libtvm_runtime_cuda.so"
        try:
            ctypes.CDLL(str(runtime), mode=ctypes.RTLD_LOCAL)
        except OSError as error:
            raise ResawareError(
                f"TVM's CUDA runtime library does not load ({error}): is the CUDA 13 runtime (libcudart.so.13) "
                "installed?"
            ) from None
    return driver


@cache
def prepare_build() -> bool:
    """Make TVM build CUDA kernels in this process with nvcc; True if a real driver is present.

    Sets `TVM_CUDA_COMPILE_MODE=nvcc` unless it is set to nvrtc and `cuda.bindings` (which NVRTC needs)
    imports.
    """
    if os.environ.get("TVM_CUDA_COMPILE_MODE", "").lower() != "nvrtc" or not _has_cuda_bindings():
        os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
        if nvcc_path() is None:
            raise ResawareError(
                "nvcc is not on PATH (nor in $CUDA_HOME or /usr/local/cuda): install the CUDA toolkit to build "
                "CUDA kernels"
            )
    driver = load_runtime()
    import tvm.support.nvcc  # noqa: F401  registers TVM's compile callback

    return driver


def _has_cuda_bindings() -> bool:
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        return False
    return True


@cache
def detect() -> Gpu | None:
    """GPU 0 if the driver sees one, else None."""
    load_runtime()
    import tvm

    try:
        dev = tvm.cuda(0)
        if not dev.exist:
            return None
        return Gpu(
            name=str(dev.device_name),
            sms=int(dev.multi_processor_count),
            arch="sm_" + str(dev.compute_version).replace(".", ""),
            max_threads_per_block=int(dev.max_threads_per_block),
            max_shared_memory_per_block=int(dev.max_shared_memory_per_block),
            warp_size=int(dev.warp_size),
        )
    except Exception:  # a driver without a usable device
        return None


def check_arch(arch: str) -> str:
    """`arch` if it names an SM architecture (`sm_90`, `sm_90a`), else a clear error."""
    text = str(arch).strip().lower()
    digits = text[3:].rstrip("af")
    if not text.startswith("sm_") or not digits.isdigit() or int(digits) < 50:
        raise ResawareError(
            f"CUDA arch {arch!r} is not an SM architecture: give e.g. sm_90 (H100/H200) or sm_80 (A100)"
        )
    if int(digits) < 75:
        raise ResawareError(f"CUDA arch {arch!r} is older than CUDA 13 builds for (sm_75 and newer): give e.g. sm_90")
    return text


def check_target_arch(target_kind: str, arch: str | None) -> None:
    """Refuse an `arch` given for a non-CUDA target, or one that names no SM architecture."""
    if arch is not None and target_kind != "cuda":
        raise ResawareError("--arch names a CUDA architecture: use it with --target cuda")
    if arch is not None:
        check_arch(arch)


def target(arch: str | None = None):
    """The CUDA target: the detected GPU's (unless `arch` overrides), else `arch` or `sm_90`.

    The host side is generic x86-64/AArch64 code, since it runs on the GPU machine's CPU, not this one's.
    """
    from tvm.target import Target

    gpu = detect()
    spec = {"kind": "cuda", "arch": check_arch(arch) if arch else gpu.arch if gpu else DEFAULT_ARCH}
    if gpu is not None:
        spec.update(
            max_threads_per_block=gpu.max_threads_per_block,
            max_shared_memory_per_block=gpu.max_shared_memory_per_block,
            thread_warp_size=gpu.warp_size,
        )
    else:  # what every architecture from sm_75 on guarantees without opting in
        spec.update(max_threads_per_block=1024, max_shared_memory_per_block=49152, thread_warp_size=32)
    return Target({**spec, "host": {"kind": "llvm"}})


def default_schedules(mod, cuda_target):
    """TVM's GPU default schedules (dlight) for the kernels no record scheduled."""
    from tvm.s_tir import dlight as dl

    rules = [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]
    with cuda_target:
        return dl.ApplyDefaultSchedule(*rules)(mod)
