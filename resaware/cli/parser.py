"""The `resaware` command line: its subcommands, their arguments and help."""

from __future__ import annotations

import argparse
import re

from resaware.errors import ResawareError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2, no usage dump
        self.exit(2, f"resaware: error: {message} (see `{self.prog} --help`)\n")


def parse_duration(text: str) -> float:
    """`90s`, `30m`, `1h30m` or bare seconds -> seconds."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
        if not parts or "".join(a + b for a, b in parts) != text:
            raise ResawareError(f"--time {text!r} is not a duration: use e.g. 90s, 30m or 1h30m")
        seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if seconds <= 0:
        raise ResawareError(f"--time {text!r} must be longer than zero")
    return seconds


def _shape_arg(p):
    p.add_argument(
        "--shape", action="append", metavar="NAME=DxD", help="full shape of an input, repeatable (e.g. ids=2x64)"
    )


def _model_args(p):
    p.add_argument("model", help="an .onnx file or zoo:NAME (see `resaware zoo`)")
    _shape_arg(p)


def _target_args(p):
    p.add_argument("--target", default="llvm", choices=["llvm", "cuda"], help="llvm (this CPU) or cuda (default llvm)")
    p.add_argument("--arch", help="CUDA architecture to build for (default: the GPU's, else sm_90); needs no GPU")
    _layout_arg(p)


def _layout_arg(p):
    p.add_argument("--layout", default="auto", choices=("auto", "NCHW", "NHWC", "NHWC-winograd"),
                   help="the convolutions' layout (default auto: NHWC on CPU, NCHW on CUDA; NHWC-winograd: "
                        "NHWC with 3x3 stride-1 ones as Winograd, CPU only; compile: the records')")  # fmt: skip


def _store_arg(p):
    p.add_argument("--store", help="store directory (default: $RESAWARE_STORE or the user cache)")


def _time_arg(p):
    # Checked with --trials by _check_trials: one of the two, or both.
    p.add_argument("--time", help="wall-clock tuning limit per budget (e.g. 30m); stops at trials or time, "
                   "whichever first; --time alone tunes for that long")  # fmt: skip


_EPILOG = """\
a budget is a share of this machine: 0.5, 50% and 50 all mean half of its usable cores.

a typical session:
  resaware tune zoo:squeezenet --budgets 50%,100% --trials 256 --store ./store
  resaware compile zoo:squeezenet --budget 50% --store ./store -o squeezenet-50.so
  resaware run squeezenet-50.so

environment: RESAWARE_STORE (the default store), RESAWARE_CACHE (zoo models),
RESAWARE_VERBOSE=1 (TVM's own log lines). `resaware COMMAND --help` shows a command's options."""


def _command(sub, name: str, help: str) -> argparse.ArgumentParser:
    """A (sub)command whose --help opens with its one-line summary."""
    return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")


def parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="resaware",
        description="Tune models with TVM MetaSchedule for the share of a device they will run on.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND",
                                title="commands")  # fmt: skip

    _command(sub, "zoo", help="list the zoo models (zoo:NAME)")

    p = _command(sub, "tasks", help="list a model's tuning tasks")
    _model_args(p)
    p.add_argument("--budget", default="100%", help="budget whose target the tasks are extracted for")
    _target_args(p)

    p = _command(sub, "record", help="write the tasks some models need (a plan) without measuring")
    p.add_argument("models", nargs="+", metavar="MODEL", help="an .onnx file or zoo:NAME, one or more")
    _shape_arg(p)
    p.add_argument("--budgets", required=True, help="comma-separated budgets to tune the plan at, e.g. 50%%,100%%")
    p.add_argument("-o", "--output", required=True, help="path of the plan (.json)")
    _layout_arg(p)

    p = _command(sub, "tune", help="tune a model (or a plan) at one or more budgets")
    p.add_argument("model", nargs="?", help="an .onnx file or zoo:NAME (see `resaware zoo`); or give --plan")
    _shape_arg(p)
    p.add_argument("--plan", help="tune the tasks of a plan written by `resaware record` instead of a model")
    p.add_argument("--budgets", help="comma-separated budgets, e.g. 50%%,100%% (default with --plan: the plan's)")
    p.add_argument("--trials", type=int, help="measured candidates per budget, counted in the store")
    _store_arg(p)
    _time_arg(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--concurrency", default="1", metavar="K|auto",
                   help="clients tuning each budget at once, each measuring on its own partition (default 1)")  # fmt: skip
    p.add_argument("--tracker", metavar="HOST:PORT",
                   help="measure on the servers `resaware serve` registered at this TVM RPC tracker")  # fmt: skip
    p.add_argument("--warm-start", action="store_true",
                   help="start a budget tuned for the first time from the nearest tuned budget's records")  # fmt: skip
    p.add_argument("--caches", choices=("flushed", "warm"), default="flushed",
                   help="how CPU candidates are timed: each run with the kernel's weights flushed from the caches, "
                   "as inside the model (default), or back to back; a budget keeps the way it was first tuned")  # fmt: skip
    _target_args(p)

    p = _command(sub, "serve", help="measure for tuners elsewhere: a TVM RPC server confined to a budget")
    p.add_argument("--tracker", required=True, metavar="HOST:PORT", help="the TVM RPC tracker to register with")
    p.add_argument("--budget", required=True, help="the share of this machine each measurement gets, e.g. 50%%")
    p.add_argument("--partition", type=int, help="which partition of the budget to serve on (default: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback; trusted networks only)")
    p.add_argument("--port", type=int, default=9090, help="first port to try (default 9090)")

    p = _command(sub, "compile", help="compile a model for a budget from the store's records")
    _model_args(p)
    p.add_argument("--budget", required=True, help="the budget the model will run with")
    _target_args(p)
    _store_arg(p)
    p.add_argument("-o", "--output", required=True, help="path of the compiled module (.so)")
    p.add_argument("--seed", type=int, default=0, help="seed of the default schedules for untuned kernels")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="use records of other hardware when the store has none for this machine (warned)")  # fmt: skip
    p.add_argument("--choose", choices=("nearest", "predicted"), default="nearest",
                   help="which stored budget's records: the nearest (default), or those predicted fastest at --budget")  # fmt: skip

    p = _command(sub, "predict", help="predict a model's kernel latency at a budget from the store, measuring nothing")
    _model_args(p)
    p.add_argument("--budget", required=True, help="the budget the model would run with (tuned there or not)")
    _store_arg(p)
    _layout_arg(p)
    p.add_argument("--allow-mismatch", action="store_true",
                   help="use records of other hardware when the store has none for this machine (warned)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")

    p = _command(sub, "run", help="run a compiled module and time it under a budget")
    p.add_argument("module", help="a module written by `resaware compile`")
    p.add_argument("--budget", help="budget to time it at (default: the one it was compiled for)")
    p.add_argument("--inputs", help=".npz with one array per input (by name, else in order); default random")
    p.add_argument("-o", "--output", help="write the outputs to this .npz")
    p.add_argument("--repeat", type=int, default=50, help="timed runs")

    p = _command(sub, "bench", help="tuned-at x run-at latency matrix, with untuned and ONNX Runtime rows")
    _model_args(p)
    p.add_argument("--tune-at", required=True, help="budgets to tune at, e.g. 50%%,100%%")
    p.add_argument("--run-at", required=True, help="budgets to run every module at, e.g. 50%%,100%%")
    p.add_argument("--trials", type=int, help="measured candidates per tune-at budget (store reused)")
    _store_arg(p)
    p.add_argument("--out", help="directory for the results and figures (default: a new temporary directory)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per cell and round (and at least 1 s)")
    _time_arg(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = _command(sub, "candidates", help="build candidates here, measure them on another machine, fold the timings in")
    cand_sub = p.add_subparsers(dest="candidates_command", required=True, parser_class=_Parser, metavar="ACTION")
    build = _command(cand_sub, "build", help="sample and build candidates of a model's heaviest tasks (no GPU needed)")
    _model_args(build)
    _target_args(build)
    build.add_argument("--per-task", type=int, default=16, help="candidates per task (default 16)")
    build.add_argument("--top", type=int, help="only the heaviest N tasks (default: all)")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("-o", "--output", required=True, help="a new directory for the candidates and manifest.json")
    measure = _command(cand_sub, "measure", help="time built candidates at budgets with the TVM runtime alone")
    measure.add_argument("directory", help="a directory written by `resaware candidates build`")
    measure.add_argument("--budgets", required=True, help="e.g. 25%%,50%%,100%%")
    measure.add_argument("--clients", type=int, default=1, help="clients measuring each budget at once (default 1)")
    measure.add_argument("--sharing", choices=["auto", "mps", "none"], default="auto",
                         help="how a GPU is shared: MPS clients, the whole GPU alone (100%% only), or MPS else that (default)")  # fmt: skip
    measure.add_argument("--caches", choices=("flushed", "warm"), default="flushed",
                         help="CPU: each run with the kernel's weights flushed from the caches (default), or back to back")  # fmt: skip
    fold = _command(cand_sub, "fold", help="add measured candidates to the store as the budgets' records")
    fold.add_argument("directory", help="a directory measured by `resaware candidates measure`")
    _store_arg(fold)

    _command(sub, "doctor", help="what this machine can do: CPU, GPU, MPS, nvcc, TVM, the budgets it realises")

    p = _command(sub, "store", help="inspect, merge, export and import stores")
    store_sub = p.add_subparsers(dest="store_command", required=True, parser_class=_Parser, metavar="SUBCOMMAND")
    show = _command(store_sub, "show", help="hardware, budgets, tasks, trials and best latencies")
    _store_arg(show)
    show.add_argument("-v", "--verbose", action="store_true", help="one line per task")
    merge = _command(store_sub, "merge", help="add the records of other stores (duplicates skipped)")
    merge.add_argument("sources", nargs="+", metavar="SRC", help="store directories to merge from")
    merge.add_argument("--into", required=True, metavar="DST", help="the store to merge into (created if missing)")
    export = _command(store_sub, "export", help="write a store as one archive file (.tar.gz)")
    _store_arg(export)
    export.add_argument("-o", "--output", required=True, help="path of the archive")
    imp = _command(store_sub, "import", help="merge an archive written by `store export` into a store")
    imp.add_argument("archive", help="the archive file")
    _store_arg(imp)
    return parser
