"""What every benchmark script shares: where results go, and how they are written.

Full runs write to `benchmarks/results/` (the committed figures); `--quick` runs write to a
temporary directory unless `--out` names one, so a smoke test never overwrites them.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def add_output_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="CI-sized smoke run (writes to a temporary directory)")
    parser.add_argument("--out", help="directory for the JSON, table and plots (default: benchmarks/results)")


def output_dir(args: argparse.Namespace) -> Path:
    if args.out:
        out = Path(args.out)
    elif args.quick:
        out = Path(tempfile.mkdtemp(prefix="resaware-bench-"))
    else:
        out = RESULTS
    out.mkdir(parents=True, exist_ok=True)
    return out


def write(out: Path, name: str, data: dict, table: str, command: str) -> None:
    """`<name>.json` (numbers + provenance) and `<name>.md` (the printed table and the command)."""
    data = {**data, "command": command, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node()}
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=float) + "\n")
    (out / f"{name}.md").write_text(f"```\n$ {command}\n{table}\n```\n")
    print(f"wrote {out / name}.json, .md")


def sample_candidates(model: str, target, per_task: int, tasks: int = 1) -> list[tuple[str, list]]:
    """Real candidates without tuning: (task name, scheduled modules) for the model's `tasks`
    heaviest kernels, `per_task` seeded samples of each one's design space."""
    import resaware
    from resaware import intrinsics
    from resaware.candidates import sample
    from resaware.tasks import extract

    intrinsics.register("llvm")
    found = []
    for task in extract(resaware.load_onnx(model), target)[:tasks]:
        found.append((task.name, [c.sch.mod for c in sample(task, target, per_task, seed=0)[:per_task]]))
    return found
