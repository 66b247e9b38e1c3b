"""A tuning plan: the tasks a set of models needs, recorded without measuring, tuned later elsewhere.

`record` extracts every model's tasks, merges the ones that are the same kernel (structurally equal,
weights summed across models) and writes them with the budgets to tune at. `tune(plan, ...)` then
tunes exactly those tasks on another day or machine; `compile` on the deploy machine finds their
records because it extracts the same kernels from the same models.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import tvm

from resaware.budget import Budget
from resaware.errors import ResawareError
from resaware.files import write_json
from resaware.frontend import intrinsics
from resaware.frontend.model import Model, load_onnx, read_onnx
from resaware.frontend.tasks import Task, extract
from resaware.platform import hardware

FORMAT = 1


@dataclass
class Plan:
    """Tasks (heaviest first) with their weight per model, and the budgets to tune them at."""

    models: list[str]
    budgets: list[str]
    tasks: list[Task]
    weights: list[dict[str, int]]  # per task: model name -> how often that model calls it
    tvm_version: str

    @property
    def name(self) -> str:
        """The plan's models joined by `+`."""
        return "+".join(self.models)

    def to_json(self) -> dict:
        """The plan as JSON-ready data (tasks as TVM JSON)."""
        return {
            "format": FORMAT,
            "models": self.models,
            "budgets": self.budgets,
            "tvm_version": self.tvm_version,
            "tasks": [
                {"name": t.name, "weight": t.weight, "flops": t.flops, "models": w, "workload": tvm.ir.save_json(t.mod)}
                for t, w in zip(self.tasks, self.weights)
            ],
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the plan to `path` as JSON."""
        write_json(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
        """A plan written by `save`; refused when it was recorded with another TVM version."""
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            raise ResawareError(
                f"plan {path} does not exist: write one with `resaware record MODEL... -o PLAN`"
            ) from None
        except (ValueError, UnicodeDecodeError):
            raise ResawareError(f"plan {path} is not a plan (not JSON): write one with `resaware record`") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ResawareError(f"plan {path} is not a resaware plan of format {FORMAT}: record it again")
        if data["tvm_version"] != tvm.__version__:
            raise ResawareError(
                f"plan {path} was recorded with TVM {data['tvm_version']}, this is TVM {tvm.__version__}: "
                "record it again with this TVM (kernels and their hashes change between versions)"
            )
        tasks = [
            Task(t["name"], int(t["weight"]), float(t["flops"]), tvm.ir.load_json(t["workload"])) for t in data["tasks"]
        ]
        return cls(data["models"], data["budgets"], tasks, [t["models"] for t in data["tasks"]], data["tvm_version"])


def record(models, budgets, shapes=None, layout: str = "auto") -> Plan:
    """The plan for `models` (paths, `zoo:NAME`s, Models) at `budgets`, the imported ones lowered with
    their convolutions in `layout` (`resaware.frontend.layout`); measures nothing."""
    budgets = [str(Budget.parse(b)) for b in budgets]
    if not budgets:
        raise ResawareError("no budget given: e.g. --budgets 50%,100%")
    intrinsics.register("llvm")
    # A kernel's workload does not depend on the thread count, so one extraction serves every budget.
    target = hardware.llvm_target(1)
    merged: dict[int, tuple[Task, dict[str, int]]] = {}
    names, shapes, used = [], shapes or {}, set()
    for source in models:
        if isinstance(source, Model):
            model = source
        else:  # each model takes the --shape entries naming its inputs
            proto, name, _ = read_onnx(source)
            inputs = {i.name for i in proto.graph.input}
            used |= inputs & set(shapes)
            model = load_onnx(proto, {k: v for k, v in shapes.items() if k in inputs}, name=name, layout=layout)
        if model.name in names:
            raise ResawareError(f"model {model.name} is given twice: give each model once")
        names.append(model.name)
        for task in extract(model, target):
            merged.setdefault(task.workload_hash, (task, {}))[1][model.name] = task.weight
    if set(shapes) - used:
        raise ResawareError(f"--shape names {', '.join(sorted(set(shapes) - used))}, an input of none of the models")
    tasks = []
    for first, weights in merged.values():
        tasks.append((Task(first.name, sum(weights.values()), first.flops, first.mod), weights))
    tasks.sort(key=lambda tw: (-tw[0].weight * tw[0].flops, tw[0].name))
    return Plan(names, budgets, [t for t, _ in tasks], [w for _, w in tasks], str(tvm.__version__))
