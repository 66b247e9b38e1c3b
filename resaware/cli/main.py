"""The `resaware` command: a thin layer over the Python API."""

from __future__ import annotations

import argparse
import json
import re
import sys

from resaware.budget import Budget, BudgetError
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


def _parser() -> argparse.ArgumentParser:
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


def _load_model(args):
    from resaware.frontend.model import load_onnx, parse_shapes

    return load_onnx(args.model, parse_shapes(args.shape), layout=getattr(args, "layout", "auto"))


def _cmd_zoo(args):
    from resaware.frontend import zoo

    for name in zoo.names():
        print(f"zoo:{name}")


def _cmd_tasks(args):
    from resaware.frontend.tasks import of, table

    _check_arch(args)
    print(table(of(_load_model(args), args.budget, target=args.target, arch=args.arch)))


def _cmd_record(args):
    from resaware.frontend.model import parse_shapes
    from resaware.frontend.plan import record

    plan = record(args.models, Budget.parse_list(args.budgets), parse_shapes(args.shape), args.layout)
    plan.save(args.output)
    shared = sum(1 for w in plan.weights if len(w) > 1)
    print(f"wrote {args.output}: {len(plan.tasks)} tasks of {', '.join(plan.models)} ({shared} shared), "
          f"to tune at {', '.join(plan.budgets)}")  # fmt: skip


def _cmd_tune(args):
    from resaware.frontend.plan import Plan
    from resaware.tuning.measure import Timing
    from resaware.tuning.tune import tune

    if args.trials is None and args.time is not None and args.target == "cuda":
        raise ResawareError("CUDA tuning needs --trials N (--time alone is for CPU budgets)")
    _check_trials(args.trials, args.time)
    if (args.model is None) == (args.plan is None):
        raise ResawareError("give a model or --plan PLAN (one of them)")
    if args.plan is not None and args.layout != "auto":
        raise ResawareError(
            "--layout is for a model: a plan's tasks were lowered when `resaware record` wrote it (give --layout there)"
        )
    if args.plan is None and args.budgets is None:
        raise ResawareError("--budgets is required with a model (e.g. --budgets 50%,100%)")
    budgets = Budget.parse_list(args.budgets) if args.budgets else None
    limit = parse_duration(args.time) if args.time else None
    concurrency = args.concurrency if args.concurrency == "auto" else _whole(args.concurrency, "--concurrency")
    _check_arch(args)
    model = Plan.load(args.plan) if args.plan else _load_model(args)
    if args.target == "cuda":
        held = tune(model, budgets, args.trials, store=args.store, seed=args.seed, target="cuda", arch=args.arch)
        print("\n".join(f"{budget}: {count} records" for budget, count in held.items()))
        return
    report = tune(model, budgets, args.trials, store=args.store, seed=args.seed, time_limit=limit,
                  progress=not args.no_progress and not args.json, concurrency=concurrency, tracker=args.tracker,
                  warm_start=args.warm_start, timing=Timing(flush=args.caches == "flushed"))  # fmt: skip
    print(json.dumps(report.to_json(), indent=1) if args.json else report.table())


def _check_trials(trials: int | None, time: str | None) -> None:
    # A large --trials with --time would spread each task's batches thin: --time alone means "as many as fit".
    if trials is None and time is None:
        raise ResawareError("give --trials N, --time 30m or both")
    if trials is not None and trials < 0:
        raise ResawareError(f"--trials must be >= 0, got {trials}")


def _whole(text: str, flag: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ResawareError(f"{flag} {text!r} is not a whole number >= 1 (or auto)")
    return int(text)


def _cmd_serve(args):
    from resaware.tuning.remote import serve

    if args.partition is not None and args.partition < 0:
        raise ResawareError(f"--partition must be >= 0, got {args.partition}")
    try:
        serve(Budget.parse(args.budget), args.tracker, host=args.host, port=args.port, partition=args.partition)
    except KeyboardInterrupt:
        print("resaware: stopped serving", file=sys.stderr)


def _check_arch(args) -> None:
    """Refuse a bad --arch before the (slow) model import."""
    from resaware.platform.cuda import check_target_arch

    check_target_arch(args.target, args.arch)


def _cmd_compile(args):
    from resaware.deploy.compiling import compile

    budget = Budget.parse(args.budget)
    _check_arch(args)
    model = _load_model(args)
    compiled = compile(model, budget, store=args.store, target=args.target, seed=args.seed,
                       allow_mismatch=args.allow_mismatch, arch=args.arch, choose=args.choose)  # fmt: skip
    path = compiled.export(args.output)
    info = compiled.info
    tuned = f"tuned at {info['tuned_at']}" if info["tuned_at"] else "untuned"
    layout = f", {info['layout']} convolutions" if info["layout"] else ""
    print(f"wrote {path} ({info['model']} for {info['budget']}, {tuned}: "
          f"{info['tuned_tasks']}/{info['tasks']} kernels from {info['records']} records{layout})")  # fmt: skip


def _cmd_predict(args):
    from dataclasses import asdict

    from resaware.deploy.predict import predict

    budget = Budget.parse(args.budget)
    prediction = predict(_load_model(args), budget, store=args.store, allow_mismatch=args.allow_mismatch)
    choice = prediction.choice
    if args.json:
        print(json.dumps({**asdict(prediction), "choice": choice.key if choice else None}, indent=1))
        return
    print(prediction.table())
    if choice is not None:
        print(f"compile with its records: resaware compile ... --budget {args.budget} --choose predicted")


def _read_inputs(path, compiled):
    import numpy as np

    try:
        data = np.load(path)
    except Exception as error:
        raise ResawareError(f"--inputs {path!r} is not a readable .npz file ({type(error).__name__})") from None
    names = [s["name"] for s in compiled.inputs]
    if names and set(names) <= set(data.files):
        return [data[n] for n in names]
    return [data[k] for k in data.files]


def _cmd_run(args):
    import numpy as np

    from resaware.platform import confine, hardware
    from resaware.runtime.compiled import load, provenance_warnings

    if args.repeat < 1:
        raise ResawareError(f"--repeat must be at least 1, got {args.repeat}")
    budget = Budget.parse(args.budget) if args.budget else None
    compiled = load(args.module)
    compiled.require_device()
    cuda = compiled.info.get("target_kind") == "cuda"
    if not cuda:  # a CUDA module's provenance is its GPU, and its budget an MPS share (see measure_built)
        share = Budget.parse(budget or compiled.budget or 1.0).cpu(confine.usable_cores())
        for warning in provenance_warnings(compiled.info, share.fraction, hardware.detect().id):
            print(f"resaware: warning: {warning}", file=sys.stderr)
    inputs = _read_inputs(args.inputs, compiled) if args.inputs else compiled.random_inputs(0)
    outputs = compiled(*inputs)
    names = compiled.info.get("outputs") or [f"output_{i}" for i in range(len(outputs))]
    for name, out in zip(names, outputs):
        print(f"{name}: {out.dtype} {tuple(out.shape)}  mean {float(np.mean(out)):.6g}  max {float(np.max(out)):.6g}")
    if args.output:
        np.savez(args.output, **dict(zip(names, outputs)))
        print(f"wrote {args.output}")
    if cuda:
        print("latency: CUDA modules are timed per MPS share by `python -m resaware.runtime.measure_built`")
        return
    print(f"latency: {compiled.benchmark(budget=budget, repeat=args.repeat)}")


def _cmd_bench(args):
    import json
    import tempfile
    from pathlib import Path

    from resaware.analysis.bench import cross_budget
    from resaware.analysis.plot import heatmap, task_bars, tuning_curves

    _check_trials(args.trials, args.time)
    tune_at, run_at = Budget.parse_list(args.tune_at), Budget.parse_list(args.run_at)
    limit = parse_duration(args.time) if args.time else None
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ResawareError(f"--out {args.out} is a file: give a directory for the results")
    model = _load_model(args)
    result = cross_budget(model, tune_at, run_at, args.trials, store=args.store, rounds=args.rounds,
                          repeat=args.repeat, seed=args.seed, time_limit=limit, progress=not args.no_progress)  # fmt: skip
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="resaware-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    table = result.table()
    print(table)
    stem = out / f"{result.model}-cross-budget"
    Path(f"{stem}.json").write_text(json.dumps(result.to_json(), indent=1) + "\n")
    Path(f"{stem}.md").write_text(f"```\n{table}\n```\n")
    heatmap(result, f"{stem}.png")
    tuning_curves(result.tuning, f"{stem}-curves.png")
    task_bars(result.tuning, f"{stem}-tasks.png")
    print(f"wrote {stem}.json, .md, .png (heatmap), -curves.png, -tasks.png")


def _cmd_candidates(args):
    from pathlib import Path

    if args.candidates_command == "build":
        from resaware.tuning.candidates import build

        _check_arch(args)
        if args.per_task < 1 or (args.top is not None and args.top < 1):
            raise ResawareError("--per-task and --top must be at least 1")
        manifest = build(_load_model(args), args.target, args.output, per_task=args.per_task, top=args.top,
                         arch=args.arch, seed=args.seed)  # fmt: skip
        size = sum(f.stat().st_size for f in Path(args.output).iterdir())
        print(f"built {len(manifest['candidates'])} candidates of {len(manifest['tasks'])} tasks for "
              f"{manifest['target'].get('arch', manifest['kind'])} in {args.output} ({size / 2**20:.1f} MiB); "
              f"measure them with: python -m resaware.runtime.measure_built {args.output} --budgets ...")  # fmt: skip
    elif args.candidates_command == "measure":
        from resaware.runtime.measure_built import main as measure_main

        code = measure_main([args.directory, "--budgets", args.budgets, "--clients", str(args.clients),
                             "--sharing", args.sharing, "--caches", args.caches])  # fmt: skip
        if code:
            raise SystemExit(code)
    else:
        from resaware.store import Store
        from resaware.tuning.candidates import fold

        added = fold(args.directory, args.store)
        print(f"folded into store {Store.open(args.store).root}: "
              + ", ".join(f"{b} +{n} records" for b, n in added.items()))  # fmt: skip


def _cmd_doctor(args):
    from resaware.platform.doctor import report

    print(report())


def _cmd_store(args):
    from resaware.store import Store, exchange

    if args.store_command == "show":
        print(Store.open(args.store).show(verbose=args.verbose))
    elif args.store_command == "export":
        path = exchange.export(args.store, args.output)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) from store {Store.open(args.store).root}")
    else:
        into = args.into if args.store_command == "merge" else args.store
        merged = (
            exchange.merge(args.sources, into)
            if args.store_command == "merge"
            else exchange.import_(args.archive, into)
        )
        print(f"merged into store {Store.open(into).root}:")
        print("\n".join(m.line() for m in merged) or "  nothing to merge")


def main(argv=None) -> int:
    """Run the `resaware` command with `argv` (default: the process's); returns the exit code."""
    args = _parser().parse_args(argv)
    handler = {"zoo": _cmd_zoo, "tasks": _cmd_tasks, "record": _cmd_record, "tune": _cmd_tune, "compile": _cmd_compile, "predict": _cmd_predict,
               "run": _cmd_run, "bench": _cmd_bench, "store": _cmd_store, "serve": _cmd_serve,
               "candidates": _cmd_candidates, "doctor": _cmd_doctor}[args.command]  # fmt: skip
    try:
        handler(args)
    except (ResawareError, BudgetError) as error:
        print(f"resaware: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("resaware: interrupted; every record measured so far is kept in the store", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
