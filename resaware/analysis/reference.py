"""ONNX Runtime, the runtime users would pick instead: the outputs to match and the latency to beat.

Timed like a compiled module: in a child confined to the budget's cores, with as many intra-op
threads as cores and sequential execution (one inter-op thread), on the same seeded inputs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

from resaware.frontend.model import Model, TensorSpec
from resaware.runtime.compiled import Latency, child_times, time_calls


def session(model_path: str, threads: int | None = None):
    """An ONNX Runtime CPU session, sequential, with `threads` intra-op threads (default: ORT's)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])


def onnx_path(model: Model, directory: str) -> str:
    """A file ONNX Runtime can open for `model`: its source, or the proto written into `directory`."""
    if model.source and os.path.isfile(model.source):
        return model.source
    import onnx

    path = os.path.join(directory, f"{model.name}.onnx")
    onnx.save(model.onnx_model, path)
    return path


def outputs(model: Model, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime's outputs for `inputs` (in the model's input order)."""
    with tempfile.TemporaryDirectory() as tmp:
        run = session(onnx_path(model, tmp))
        return run.run(None, {spec.name: array for spec, array in zip(model.inputs, inputs)})


def latency(model: Model, cores, budget: str, repeat: int = 10, warmup: int = 3, min_seconds: float = 0.0) -> Latency:
    """ONNX Runtime's latency on the model's seeded random inputs, in a child confined to `cores`."""
    from resaware.platform.confine import run_pinned

    cores = sorted(cores)
    with tempfile.TemporaryDirectory() as tmp:
        options = {"repeat": repeat, "warmup": warmup, "min_seconds": min_seconds, "threads": len(cores),
                   "inputs": [s.to_json() for s in model.inputs]}  # fmt: skip
        done = run_pinned(
            [sys.executable, "-m", "resaware.analysis.reference", onnx_path(model, tmp), json.dumps(options)], cores
        )
    return Latency.from_times(child_times(done), budget, cores)


def _time_main(path: str, options: dict) -> list[float]:
    run = session(path, options["threads"])
    rng = np.random.default_rng(0)  # the same inputs CompiledModel.random_inputs(0) makes
    feeds = {s["name"]: TensorSpec.from_json(s).random(rng) for s in options["inputs"]}
    return time_calls(lambda: run.run(None, feeds), options["repeat"], options["warmup"], options["min_seconds"])


if __name__ == "__main__":
    print(json.dumps(_time_main(sys.argv[1], json.loads(sys.argv[2]))))
