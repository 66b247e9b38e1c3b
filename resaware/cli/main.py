"""The `resaware` command: a thin layer over the Python API."""

from __future__ import annotations

import json
import sys

from resaware.budget import Budget, BudgetError
from resaware.cli.parser import parse_duration, parser
from resaware.errors import ResawareError


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
    args = parser().parse_args(argv)
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
