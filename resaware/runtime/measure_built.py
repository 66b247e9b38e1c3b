"""Measuring built candidates with the TVM runtime alone: the half of tuning a GPU machine runs.

    python -m resaware.runtime.measure_built DIR --budgets 25%,50%,100% [--device cuda] [--clients K]

reads DIR/manifest.json (written by `resaware.tuning.candidates.build`), times every candidate at every
budget and writes DIR/timings.json for `resaware.tuning.candidates.fold`. Each budget is measured by child
processes of its own: on a CPU each confined to its partition's cores; on a GPU each an MPS client at
the budget's percentage of a private daemon. Green contexts are no substitute here: TVM's CUDA runtime
calls `cudaSetDevice` before it allocates or launches, which makes the primary context current again,
so a green context set beforehand does not confine its kernels (on an H200, candidates in a 32-SM green
context ran as fast as on all 132 SMs). Where MPS cannot start, only the whole GPU (100%) is measured. A child streams one JSON line per candidate, so a candidate that kills its process
(an illegal address poisons a CUDA context) is recorded as failed and a fresh child goes on.

It imports only tvm_ffi, NumPy and resaware's plain modules and loads `libtvm_runtime.so` (and
`libtvm_runtime_cuda.so`) itself: the measuring machine needs neither the TVM compiler nor the tvm
Python package, ~4 MB of libraries (`--runtime-lib DIR`, else the installed tvm package's lib folder).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import math
import os
import platform
import struct
import subprocess
import sys
import time
from pathlib import Path

from resaware.budget import Budget, BudgetError
from resaware.errors import ResawareError, last_line

# TVM's time evaluator evicts every argument but the first (the kernel's input) from the CPU caches.
FLUSH = "cache_flush_cpu_non_first_arg"
# Flushed runs per sample at most: a kernel of microseconds would otherwise take thousands of flushes.
MAX_COLD_RUNS = 200
MANIFEST = "manifest.json"
TIMINGS = "timings.json"
_KDLCPU, _KDLCUDA = 1, 2


def runtime_dir(explicit: str | os.PathLike | None = None) -> Path:
    """Where `libtvm_runtime.so` is: `explicit`, `$RESAWARE_TVM_RUNTIME`, else the tvm package's lib
    folder (found without importing tvm)."""
    for candidate in (explicit, os.environ.get("RESAWARE_TVM_RUNTIME")):
        if candidate:
            return Path(candidate)
    spec = importlib.util.find_spec("tvm")
    if spec is None or spec.origin is None:
        raise ResawareError("no TVM runtime found: pass --runtime-lib DIR (a folder with libtvm_runtime.so)")
    return Path(spec.origin).parent / "lib"


def _cudart_candidates(lib_dir: Path) -> list[Path]:
    """Places a CUDA 13 runtime may be when the dynamic loader does not know one."""
    places = [lib_dir / "libcudart.so.13"]
    for entry in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_runtime/lib"):
            places.append(Path(entry) / sub / "libcudart.so.13")
    return places + [Path("/usr/local/cuda/lib64/libcudart.so.13"), Path("/usr/local/cuda/lib/libcudart.so.13")]


def load_runtime(lib_dir: Path, cuda: bool) -> None:
    """Load TVM's runtime (and its CUDA part) into this process through tvm_ffi."""
    import tvm_ffi  # noqa: F401  loads libtvm_ffi.so, which the runtime links

    ctypes.CDLL(str(lib_dir / "libtvm_runtime.so"), mode=ctypes.RTLD_GLOBAL)
    if cuda:
        try:
            ctypes.CDLL(str(lib_dir / "libtvm_runtime_cuda.so"), mode=ctypes.RTLD_LOCAL)
        except OSError as first:
            for cudart in _cudart_candidates(lib_dir):
                if cudart.exists():
                    ctypes.CDLL(str(cudart), mode=ctypes.RTLD_GLOBAL)
                    ctypes.CDLL(str(lib_dir / "libtvm_runtime_cuda.so"), mode=ctypes.RTLD_LOCAL)
                    break
            else:
                raise ResawareError(f"TVM's CUDA runtime does not load ({first}): no libcudart.so.13 found") from None


def _tensor(shape, dtype: str, device, rng):
    import numpy as np
    import tvm_ffi

    if "float" in dtype:
        data = rng.uniform(-1, 1, size=shape).astype(dtype)
    else:
        data = rng.integers(0, 8, size=shape).astype(dtype)
    data = np.ascontiguousarray(data)
    tensor = tvm_ffi.get_global_func("runtime.TVMTensorAllocWithScope")(
        tvm_ffi.Shape(shape), tvm_ffi.dtype(dtype), device, None
    )
    tvm_ffi.get_global_func("runtime.TVMTensorCopyFromBytes")(tensor, ctypes.c_void_p(data.ctypes.data), data.nbytes)
    return tensor


def cold_samples(runs, repeat: int, min_repeat_ms: int) -> list[float]:
    """`repeat` samples of at least `min_repeat_ms`, each the mean of runs that each start with the
    caches flushed; `runs(n)` times n such runs (seconds each). TVM's evaluator flushes once a sample,
    before all of its runs, so a flushed sample is one run and the means are taken here."""
    once = max(runs(1)[0], 1e-7)  # also loads the code, as a warm-up run would
    n = max(1, min(MAX_COLD_RUNS, math.ceil(min_repeat_ms / 1e3 / once)))
    times = runs(n * repeat)
    return [sum(times[i * n : (i + 1) * n]) / n for i in range(repeat)]


def _timed(module, args: list, cuda: bool, repeat: int, min_ms: int, flush: bool = False) -> list[float]:
    """Seconds per run of `module`'s main, `repeat` samples of at least `min_ms` each (TVM's time
    evaluator, as MetaSchedule's runner uses it); with `flush` (CPU), each run with the weights flushed."""
    import tvm_ffi

    def runs(n: int, min_ms: int = 0, preproc: str = FLUSH) -> list[float]:
        timer = tvm_ffi.get_global_func("runtime.RPCTimeEvaluator")(
            module, "main", _KDLCUDA if cuda else _KDLCPU, 0, 1, n, min_ms, 100, 0, 1, 0, preproc
        )
        return list(struct.unpack("@" + "d" * n, timer(*args)))

    if flush and not cuda:
        return cold_samples(runs, repeat, min_ms)
    return runs(repeat, min_ms, "")


def _child(directory: Path, ids: list[str], options: dict) -> None:
    """Time `ids` one by one in this process; one JSON line each on stdout."""
    import numpy as np
    import tvm_ffi

    manifest = json.loads((directory / MANIFEST).read_text())
    cuda = manifest["device"] == "cuda"
    load_runtime(runtime_dir(options.get("runtime_lib")), cuda)
    device = tvm_ffi.device("cuda" if cuda else "cpu", 0)
    by_id = {c["id"]: c for c in manifest["candidates"]}
    args_cache: dict[str, list] = {}
    warmup_ms = int(options.get("warmup_ms") or 0)
    for cid in ids:
        candidate = by_id[cid]
        print(json.dumps({"id": cid, "started": True}), flush=True)
        try:
            key = json.dumps(candidate["args"])
            if key not in args_cache:  # every candidate of a task takes the same arguments
                rng = np.random.default_rng(0)
                args_cache[key] = [_tensor(tuple(shape), dtype, device, rng) for _, dtype, shape in candidate["args"]]
            module = tvm_ffi.load_module(str(directory / candidate["file"]))
            if warmup_ms:  # an idle GPU clocks down: run first, so the first candidates are not slower
                _timed(module, args_cache[key], cuda, 1, warmup_ms)
                warmup_ms = 0
            secs = _timed(module, args_cache[key], cuda, int(options["repeat"]), int(options["min_repeat_ms"]),
                          bool(options.get("flush")))  # fmt: skip
            print(json.dumps({"id": cid, "secs": secs}), flush=True)
        except Exception as error:  # a failed candidate is a result
            print(json.dumps({"id": cid, "error": last_line(error)}), flush=True)
    with open("/proc/self/maps") as maps:  # what this process needed: the runtime, not the compiler
        facts = {"tvm_package": "tvm" in sys.modules, "compiler_loaded": any("libtvm_compiler" in m for m in maps)}
    if cuda:  # under MPS the driver reports the SMs this client was provisioned (7: multiprocessor count)
        facts["sms_seen"] = int(tvm_ffi.get_global_func("runtime.GetDeviceAttr")(_KDLCUDA, 0, 7))
    print(json.dumps({"runtime": facts}), flush=True)


def _run_children(directory: Path, ids: list[str], env: dict, cores, options: dict,
                  silence_s: float = 120.0) -> tuple[dict, dict]:  # fmt: skip
    """Measure `ids` in child processes until each has a result; a child that dies, or says nothing for
    `silence_s`, takes only the candidate it was timing with it. Returns the results and what the last
    child had loaded."""
    import queue
    import threading

    results: dict[str, dict] = {}
    runtime: dict = {}
    remaining = list(ids)
    while remaining:
        process = subprocess.Popen(
            [sys.executable, "-m", "resaware.runtime.measure_built", "--child", str(directory)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **env, "TVM_USE_RUNTIME_LIB": "1"},
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        )  # fmt: skip
        process.stdin.write(json.dumps({"ids": remaining, **options}))
        process.stdin.close()
        lines: queue.Queue = queue.Queue()
        errors: list[str] = []
        threading.Thread(target=_pump, args=(process.stdout, lines.put), daemon=True).start()
        threading.Thread(target=_pump, args=(process.stderr, errors.append), daemon=True).start()
        in_flight, hung, progressed = None, False, False
        while True:
            try:
                line = lines.get(timeout=silence_s)
            except queue.Empty:  # a hung launch or a driver that never answers
                process.kill()
                hung = True
                break
            if line is None:
                break
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "runtime" in item:
                runtime = item["runtime"]
            elif item.get("started"):
                in_flight = item["id"]
            else:
                results[item["id"]] = {k: v for k, v in item.items() if k != "id"}
                in_flight, progressed = None, True
        process.wait()
        text = "".join(e for e in errors if e).strip()
        why = f"silent for {silence_s:g} s" if hung else last_line(text) if text else f"exit code {process.returncode}"
        if in_flight is not None:
            results[in_flight] = {"error": f"measuring process died: {why}"}
        elif not progressed:
            raise ResawareError(f"measuring process failed before its first candidate: {why}")
        remaining = [i for i in remaining if i not in results]
    return results, runtime


def _pump(stream, put) -> None:
    """Hand every line of `stream` to `put`, then None."""
    for line in stream:
        put(line)
    put(None)


def _split(items: list, k: int) -> list[list]:
    return [items[i::k] for i in range(k)]


def _machine(manifest: dict, options: dict) -> dict:
    """What the timings were measured on (the store's hardware for them)."""
    from resaware.platform.hardware import ISA_FLAGS, cpuinfo

    model, flags = cpuinfo()
    machine = {"cpu_model": model, "isa": [f for f in ISA_FLAGS if f in flags], "machine": platform.machine(),
               "usable_cores": len(os.sched_getaffinity(0))}  # fmt: skip
    if manifest["device"] == "cuda":
        machine.update(_gpu_facts(options))
    return machine


def _gpu_facts(options: dict) -> dict:
    """GPU 0's name, SMs and arch, read by a child through the TVM runtime alone."""
    code = (
        "import json,sys,tvm_ffi;from resaware.runtime.measure_built import load_runtime,runtime_dir;"
        f"load_runtime(runtime_dir({options.get('runtime_lib')!r}),True);"
        "a=tvm_ffi.get_global_func('runtime.GetDeviceAttr');"
        # (kDLCUDA, device 0, DeviceAttrKind): 4 compute version, 5 name, 7 SMs, 12 driver version
        "print(json.dumps({'gpu_name':a(2,0,5),'gpu_sms':a(2,0,7),'gpu_arch':'sm_'+str(a(2,0,4)).replace('.',''),"
        "'gpu_driver':str(a(2,0,12))}))"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise ResawareError("no usable CUDA GPU here (the driver did not answer in 120 s)") from None
    if done.returncode != 0:
        raise ResawareError(f"no usable CUDA GPU here ({last_line(done.stderr or f'exit code {done.returncode}')})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(directory: str | os.PathLike, budgets, clients: int = 1, repeat: int = 5, min_repeat_ms: int = 20,
            sharing: str = "auto", runtime_lib: str | None = None, only: list[str] | None = None,
            output: str = TIMINGS, flush: bool = True) -> dict:  # fmt: skip
    """Time every candidate in `directory` (or those in `only`) at every budget; writes the timings to
    `directory/output` and returns them.

    `sharing` (CUDA only): `mps`, `none` (the whole GPU, 100% only) or `auto` (MPS, else none).
    `flush` (CPU only): time each run with the kernel's weights flushed from the caches (`measure.Timing`).
    """
    from resaware.platform import confine

    budgets = Budget.parse_list(budgets) if isinstance(budgets, str) else [Budget.parse(b) for b in budgets]
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not manifest_path.exists():
        raise ResawareError(f"{directory} has no {MANIFEST}: build candidates with `resaware candidates build` first")
    manifest = json.loads(manifest_path.read_text())
    cuda = manifest["device"] == "cuda"
    options = {"repeat": repeat, "min_repeat_ms": min_repeat_ms, "runtime_lib": runtime_lib,
               "warmup_ms": 1000 if cuda else 0, "flush": flush and not cuda}  # fmt: skip
    ids = [c["id"] for c in manifest["candidates"] if only is None or c["id"] in only]
    timings = {"format": 1, "device": manifest["device"], "hardware": _machine(manifest, options), "budgets": {}}
    if not cuda:
        timings["caches"] = "flushed" if flush else "warm"
    daemon, how = None, "cores"
    if cuda:
        daemon = _start_daemon(sharing, timings) if sharing in ("auto", "mps") else None
        how = "mps" if daemon is not None else "none"
    timings["sharing"] = how
    try:
        queue = list(budgets)
        while queue:
            budget = queue[0]
            started = time.monotonic()
            if cuda:
                if how != "mps" and daemon is not None:
                    daemon.stop()
                    daemon = None
                if how == "none" and budget.fraction < 1.0:
                    print(f"resaware: skipping {budget}: without MPS only the whole GPU (100%) is measured",
                          file=sys.stderr)  # fmt: skip
                    queue.pop(0)
                    continue
                env, realised, key = _gpu_share(how, budget, daemon)
                k = min(clients, budget.mps_clients)
                parts = [(env, None, options)] * k
            else:
                share = budget.cpu(confine.usable_cores())
                realised, key = share.fraction, share.key
                k = min(clients, share.max_concurrency)
                parts = [(confine.environment(p.count), p.cores, options) for p in share.partitions(k)]
            try:
                results, runtime = _measure_parallel(directory, _split(ids, k), parts)
            except ResawareError as error:
                # In auto mode MPS clients that fail before any budget is measured give way to the whole GPU.
                if how != "mps" or sharing != "auto" or timings["budgets"]:
                    raise
                tail = f" (MPS log: {daemon.log_tail()})" if daemon is not None else ""
                timings.setdefault("sharing_failures", {})["mps"] = str(error) + tail
                print(f"resaware: MPS clients failed ({error}){tail}; measuring the whole GPU (100%) only",
                      file=sys.stderr)  # fmt: skip
                how = timings["sharing"] = "none"
                continue
            timings["budgets"][str(budget)] = {
                "fraction": realised, "key": key, "clients": k, "seconds": round(time.monotonic() - started, 2),
                "measuring_process": runtime, "results": results,
            }  # fmt: skip
            queue.pop(0)
    finally:
        if daemon is not None:
            timings["mps_servers_seen"] = bool(daemon.servers())
            daemon.stop()
    if not timings["budgets"]:
        raise ResawareError("no budget was measured: without MPS only 100% can be (see the lines above)")
    timings["tvm_version"] = manifest["tvm_version"]
    (directory / output).write_text(json.dumps(timings, indent=1) + "\n")
    return timings


def _start_daemon(sharing: str, timings: dict):
    """A private MPS daemon, or None (and why, in `timings`) when it cannot start and `sharing` allows that."""
    from resaware.platform import mps

    try:
        return mps.MpsDaemon().start()
    except mps.MpsUnavailable as error:
        if sharing == "mps":
            raise
        timings.setdefault("sharing_failures", {})["mps"] = str(error)
        print(f"resaware: {error}; measuring the whole GPU (100%) only", file=sys.stderr)
        return None


def _gpu_share(how: str, budget: Budget, daemon) -> tuple[dict, float, str]:
    """(environment of a measuring child, realised fraction, store key) of `budget` shared by `how`."""
    if how == "mps":
        return daemon.client_env(budget), budget.mps_percentage / 100, f"mps-{budget.mps_percentage}"
    return {}, 1.0, "gpu-100"


def _measure_parallel(directory: Path, shards: list[list[str]], parts: list[tuple]) -> tuple[dict, dict]:
    """One thread per client, each driving its own child processes on its partition."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(shards)) as pool:
        futures = [
            pool.submit(_run_children, directory, shard, env, cores, options)
            for shard, (env, cores, options) in zip(shards, parts)
        ]
        merged: dict = {}
        runtime: dict = {}
        for future in futures:
            results, runtime = future.result()
            merged.update(results)
    return merged, runtime


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m resaware.runtime.measure_built", description=__doc__.splitlines()[0]
    )
    parser.add_argument("directory")
    parser.add_argument("--budgets", help="e.g. 25%%,50%%,100%%")
    parser.add_argument("--clients", type=int, default=1, help="clients measuring each budget at once")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--min-repeat-ms", type=int, default=20)
    parser.add_argument("--sharing", choices=["auto", "mps", "none"], default="auto",
                        help="GPU: MPS clients, the whole GPU alone (100%% only), or MPS else that (default)")  # fmt: skip
    parser.add_argument("--runtime-lib", help="folder with libtvm_runtime.so (default: the tvm package's)")
    parser.add_argument("--caches", choices=["flushed", "warm"], default="flushed",
                        help="CPU: each run with the kernel's weights flushed from the caches (default), or back to back")  # fmt: skip
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.clients < 1 or args.repeat < 1 or args.min_repeat_ms < 0:
        print("resaware: error: --clients and --repeat must be at least 1, --min-repeat-ms at least 0", file=sys.stderr)
        return 2
    if args.child:
        options = json.loads(sys.stdin.read())
        _child(Path(args.directory), options.pop("ids"), options)
        return 0
    try:
        if not args.budgets:
            raise BudgetError("give the budgets to measure at, e.g. --budgets 25%,50%,100%")
        timings = measure(args.directory, args.budgets, args.clients, args.repeat, args.min_repeat_ms,
                          args.sharing, args.runtime_lib, flush=args.caches == "flushed")  # fmt: skip
    except ResawareError as error:
        print(f"resaware: error: {error}", file=sys.stderr)
        return 2
    for budget, entry in timings["budgets"].items():
        ok = sum(1 for r in entry["results"].values() if "secs" in r)
        print(f"{budget}: {ok}/{len(entry['results'])} candidates timed in {entry['seconds']} s ({entry['key']})")
    print(f"wrote {Path(args.directory) / TIMINGS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
