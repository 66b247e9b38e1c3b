"""A compiled model: run it, time it under a budget, export it, load it back.

Only the TVM runtime is needed here, so an exported module loads and runs in a process started with
`TVM_USE_RUNTIME_LIB=1` (no compiler). Provenance (budget tuned for, hardware, inputs) travels in a
JSON file beside the library.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from resaware import files
from resaware.budget import Budget
from resaware.errors import ResawareError, last_line
from resaware.runtime.spec import TensorSpec

SIDECAR = ".resaware.json"


@dataclass
class Latency:
    """Wall-clock latency of one inference, in a process confined to `cores`."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    mean_ms: float
    runs: int
    budget: str
    cores: list[int]

    @classmethod
    def from_times(cls, times: list[float], budget: str, cores: list[int]) -> Latency:
        """Summary of per-run seconds measured at `budget` on `cores`."""
        return cls(
            statistics.median(times), _percentile(times, 10), _percentile(times, 90), statistics.fmean(times),
            len(times), budget, cores,
        )  # fmt: skip

    def __str__(self) -> str:
        return (f"{self.median_ms:.3f} ms median (p10 {self.p10_ms:.3f}, p90 {self.p90_ms:.3f}; "
                f"{self.runs} runs at {self.budget} on cores {self.cores})")  # fmt: skip


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


class CompiledModel:
    """A Relax VM module built for one budget. Call it like ONNX Runtime's `run(None, feeds)`."""

    def __init__(self, module, info: dict, path: str | None = None):
        import tvm

        self._module = module
        self.info = info
        self.path = path
        from tvm.runtime.vm import VirtualMachine

        from resaware.platform.quiet import native_stderr

        self._vm = None
        if info.get("target_kind") == "cuda":
            from resaware.platform import cuda

            if cuda.detect() is None:  # built here for a GPU elsewhere: exportable, not runnable
                return
            device = tvm.cuda(0)
        else:
            device = tvm.cpu()
        self.device = device
        with native_stderr():  # one "Scope Loaded" line per kernel otherwise
            self._vm = VirtualMachine(module, device)

    @property
    def inputs(self) -> list[dict]:
        """The model's inputs (name, shape, dtype) as the sidecar records them."""
        return self.info.get("inputs", [])

    @property
    def budget(self) -> str | None:
        """The budget the module was compiled for."""
        return self.info.get("budget")

    def _arrays(self, args, kwargs) -> list[np.ndarray]:
        specs = self.inputs
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            kwargs, args = args[0], ()
        if kwargs:
            if args:
                raise ResawareError("give inputs either positionally or by name, not both")
            names = [s["name"] for s in specs]
            unknown = sorted(set(kwargs) - set(names))
            missing = [n for n in names if n not in kwargs]
            if unknown or missing:
                raise ResawareError(
                    f"inputs by name: unknown {unknown or 'none'}, missing {missing or 'none'}; the model takes {names}"
                )
            args = tuple(kwargs[n] for n in names)
        if specs and len(args) != len(specs):
            raise ResawareError(
                f"the model takes {len(specs)} input(s) ({', '.join(s['name'] for s in specs)}), got {len(args)}"
            )
        arrays = []
        for i, value in enumerate(args):
            array = np.ascontiguousarray(value)
            if specs:
                spec = specs[i]
                if tuple(array.shape) != tuple(spec["shape"]) or str(array.dtype) != spec["dtype"]:
                    raise ResawareError(
                        f"input {spec['name']!r} must be {spec['dtype']} of shape {tuple(spec['shape'])}, "
                        f"got {array.dtype} of shape {tuple(array.shape)}"
                    )
            arrays.append(array)
        return arrays

    def __call__(self, *args, **kwargs) -> list[np.ndarray]:
        """Run once; returns every output as a NumPy array, in output order."""
        import tvm

        self.require_device()
        tensors = [tvm.runtime.tensor(a, device=self.device) for a in self._arrays(args, kwargs)]
        return _flatten(self._vm["main"](*tensors))

    def require_device(self) -> None:
        """Raise a clear error when this machine cannot run the module (CUDA built here, no GPU)."""
        if self._vm is None:
            raise ResawareError(
                f"this module is built for CUDA {self.info.get('arch')} and this machine has no GPU: copy it "
                "(with its .resaware.json) to the GPU machine and run it there"
            )

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Seeded random inputs of the right shapes and dtypes (as `Model.random_inputs` makes them)."""
        rng = np.random.default_rng(seed)
        return [TensorSpec.from_json(spec).random(rng) for spec in self.inputs]

    def export(self, path: str | os.PathLike) -> str:
        """Write the shared library to `path` and its provenance beside it; returns the path."""
        path = os.fspath(path)
        from resaware.platform.quiet import native_stderr

        with files.replacing(path) as tmp, native_stderr():
            self._module.export_library(str(tmp))
        files.write_json(path + SIDECAR, self.info)
        self.path = path
        return path

    def benchmark(self, budget=None, repeat: int = 50, warmup: int = 5, min_seconds: float = 0.0) -> Latency:
        """Latency in a fresh process confined to `budget` (default: the budget it was compiled for)."""
        budget = Budget.parse(budget if budget is not None else (self.budget or 1.0))
        from resaware.platform.confine import usable_cores

        if self.info.get("target_kind") == "cuda":
            self.require_device()
            raise ResawareError(
                "timing a CUDA module at a budget needs an MPS client process: measure its kernels with "
                "`python -m resaware.runtime.measure_built` (see benchmarks/gpu_check.py)"
            )

        share = budget.cpu(usable_cores())
        with tempfile.TemporaryDirectory() as tmp:
            path = self.path
            if path is None or not os.path.exists(path):
                path = self.export(os.path.join(tmp, "model.so"))
                self.path = None
            return run_confined(path, share.cores, str(budget), repeat, warmup, min_seconds, self.inputs)

    def __repr__(self) -> str:
        return f"CompiledModel({self.info.get('model')!r}, budget={self.budget}, tuned_at={self.info.get('tuned_at')})"


# A module run with this many times more (or fewer) cores than it was tuned with is far from its budget.
FAR = 1.5


def provenance_warnings(info: dict, fraction: float, hardware_id: str) -> list[str]:
    """What to know before trusting a module's speed when run at `fraction` of the machine `hardware_id`."""
    if not info:
        return ["its provenance is unknown (no sidecar file)"]
    said = []
    tuned = info.get("tuned_fraction")
    if tuned is None:
        said.append("it was compiled from no tuning records (default schedules only)")
    elif max(tuned, fraction) / min(tuned, fraction) >= FAR:
        said.append(f"it was tuned at {tuned:.0%} and runs at {fraction:.0%}: schedules tuned for one share "
                    f"can be slow at another; compile it for this budget (`resaware compile --budget {fraction:.0%}`)")  # fmt: skip
    if info.get("tuned_on") and info["tuned_on"] != hardware_id:
        said.append(f"it was tuned on other hardware ({info['tuned_on']}; this machine is {hardware_id})")
    return said


def _flatten(result) -> list[np.ndarray]:
    import tvm

    if isinstance(result, tvm.runtime.Tensor):
        return [result.numpy()]
    out = []
    for item in result:
        out.extend(_flatten(item))
    return out


def run_confined(
    path: str, cores, budget: str, repeat: int, warmup: int, min_seconds: float, inputs: list[dict]
) -> Latency:
    """Time `path` in a subprocess pinned to `cores` with the TVM runtime alone."""
    from resaware.platform.confine import run_pinned

    options = {"repeat": repeat, "warmup": warmup, "min_seconds": min_seconds, "inputs": inputs}
    done = run_pinned(
        [sys.executable, "-m", "resaware.runtime.compiled", path, json.dumps(options)],
        cores,
        {"TVM_USE_RUNTIME_LIB": "1"},
    )
    return Latency.from_times(child_times(done), budget, sorted(cores))


def child_times(done) -> list[float]:
    """The per-run milliseconds a timing child printed last, or its last error line."""
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
        raise ResawareError(f"benchmark process failed: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load(path: str | os.PathLike) -> CompiledModel:
    """Load a module written by `CompiledModel.export` (needs only the TVM runtime)."""
    import tvm

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ResawareError(f"compiled module {path!r} does not exist: write one with `resaware compile MODEL -o PATH`")
    from resaware.platform.quiet import native_stderr

    info = {}
    if os.path.exists(path + SIDECAR):
        with open(path + SIDECAR) as f:
            info = json.load(f)
    if info.get("target_kind") == "cuda":
        from resaware.platform import cuda

        cuda.load_runtime()  # its kernels load through TVM's CUDA runtime, GPU or not
    try:
        with native_stderr():
            module = tvm.runtime.load_module(path)
    except Exception as error:
        raise ResawareError(f"{path!r} is not a compiled TVM module ({last_line(error, 200)})") from None
    if not info:
        print(
            f"resaware: {path + SIDECAR} is missing: inputs are not checked and provenance is unknown", file=sys.stderr
        )
    return CompiledModel(module, info, path)


def _time_main(path: str, options: dict) -> list[float]:
    import tvm

    model = (
        load(path)
        if os.path.exists(path + SIDECAR)
        else CompiledModel(tvm.runtime.load_module(path), {"inputs": options["inputs"]}, path)
    )
    tensors = [tvm.runtime.tensor(a) for a in model.random_inputs(0)]
    main = model._vm["main"]
    return time_calls(lambda: main(*tensors), options["repeat"], options["warmup"], options["min_seconds"])


def time_calls(call, repeat: int, warmup: int, min_seconds: float) -> list[float]:
    """Milliseconds per call: `repeat` runs and at least `min_seconds`, after `warmup`; then checks
    that no thread left the process's cores (run inside a confined child)."""
    from resaware.platform.confine import thread_masks

    for _ in range(warmup):
        call()
    times = []
    start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    allowed = os.sched_getaffinity(0)
    strays = {tid: m for tid, m in thread_masks().items() if not m <= allowed}
    if strays:
        raise SystemExit(f"threads escaped the budget's cores {sorted(allowed)}: {strays}")
    return times


if __name__ == "__main__":
    print(json.dumps(_time_main(sys.argv[1], json.loads(sys.argv[2]))))
