"""The cross-budget matrix, ONNX Runtime as a confined baseline, and the benchmark scripts' quick modes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli, two_cores

import resaware
from resaware.analysis import reference
from resaware.analysis.bench import ONNXRUNTIME, UNTUNED, cross_budget, robust_budget
from resaware.platform import confine
from resaware.store import Store

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def test_onnxruntime_latency_is_confined_and_counts_runs(small_model):
    core = confine.usable_cores()[-1]
    latency = reference.latency(small_model, [core], "50%", repeat=7, warmup=1)
    assert latency.cores == [core] and latency.runs >= 7
    assert 0 < latency.p10_ms <= latency.median_ms <= latency.p90_ms


@two_cores
def test_cross_budget_reuses_the_store_and_fills_the_matrix(small_store, small_model):
    store, _ = small_store
    before = {s.key: sum(w.trials for w in s.stats().values()) for s in Store.open(store).slots()}
    result = cross_budget(small_model, ["50%", "100%"], ["50%", "75%", "100%"], trials=8, store=store,
                          rounds=2, repeat=3, min_seconds=0.05, progress=False)  # fmt: skip
    after = {s.key: sum(w.trials for w in s.stats().values()) for s in Store.open(store).slots()}
    assert after == before  # already tuned: nothing measured again
    # 75% and 100% realise the same two cores: one column, named by the budget it realises exactly
    assert result.run_at == ["50%", "100%"] and result.cores == {"50%": 1, "100%": 2}
    assert result.rows == ["tuned@50%", "tuned@100%", UNTUNED, ONNXRUNTIME]
    assert len(result.cells) == 8 and all(len(c.rounds_ms) == 2 and c.median_ms > 0 for c in result.cells)
    for budget in result.run_at:
        tuned = [result.cell(r, budget).ratio for r in result.rows if r.startswith("tuned@")]
        assert min(tuned) == pytest.approx(1.0)
    worst = {b: max(result.cell(f"tuned@{b}", r).ratio for r in result.run_at) for b in result.tune_at}
    assert result.robust == robust_budget(worst, {"50%": 0.5, "100%": 1.0})
    assert set(result.max_rel_error) == {"tuned@50%", "tuned@100%", UNTUNED}
    assert max(result.max_rel_error.values()) < 1e-4
    assert result.trials == {"50%": before["cpu-1of2"], "100%": before["cpu-2of2"]}
    assert "robust budget: tune at" in result.table()


@two_cores
def test_bench_cli_writes_json_table_and_heatmap(small_store, small_path, tmp_path):
    store, _ = small_store
    done = run_cli("bench", small_path, "--shape", "x=2x3x16x16", "--tune-at", "50%,100%", "--run-at", "100%",
                   "--trials", "8", "--store", store, "--out", tmp_path, "--rounds", "1", "--repeat", "3",
                   "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "small-cross-budget.json").read_text())
    assert data["run_at"] == ["100%"] and data["robust"] in ("50%", "100%")
    for figure in ("small-cross-budget.png", "small-cross-budget-curves.png", "small-cross-budget-tasks.png"):
        assert (tmp_path / figure).read_bytes()[:4] == b"\x89PNG", figure
    # The tuning report travels with the matrix: here it says the fixture's store was reused, not retuned.
    assert [b["stopped_by"] for b in data["tuning"]["budgets"]] == ["already tuned"] * 2
    assert "tuned@50%" in (tmp_path / "small-cross-budget.md").read_text()


@pytest.mark.parametrize(
    "args, phrase",
    [
        (["--run-at", "150%"], "outside"),
        (["--run-at", "half"], "not a number"),
        (["--time", "soon"], "not a duration"),
        (["--out", "MODEL"], "is a file"),
        (["--trials", None], "give --trials"),
        (["--trials", "-2"], "--trials must be"),
    ],
)
def test_bench_bad_input_one_line_exit_2(small_path, tmp_path, args, phrase):
    base = {"--tune-at": "50%", "--run-at": "50%", "--trials": "1", "--store": str(tmp_path)}
    base.update({k: small_path if v == "MODEL" else v for k, v in zip(args[::2], args[1::2])})
    base = {k: v for k, v in base.items() if v is not None}  # None: the option left out
    done = run_cli("bench", small_path, "--shape", "x=1x3x16x16", *[x for kv in base.items() for x in kv])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and phrase in done.stderr
    assert not any(tmp_path.iterdir())  # nothing tuned before the input was checked


def test_robust_budget_is_the_smallest_worst_ratio_and_ties_go_to_the_larger_share():
    assert robust_budget({"25%": 1.3, "50%": 1.05, "100%": 1.2}, {"25%": 0.25, "50%": 0.5, "100%": 1.0}) == "50%"
    assert robust_budget({"50%": 1.1, "100%": 1.1}, {"50%": 0.5, "100%": 1.0}) == "100%"
    assert robust_budget({}, {}) is None


def _script(name: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / name), "--quick", *map(str, args)],
                          capture_output=True, text=True, timeout=900)  # fmt: skip


@two_cores
def test_cross_budget_script_quick(tmp_path, squeezenet_store):
    store, _ = squeezenet_store
    done = _script("cross_budget.py", "--out", tmp_path, "--store", store)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "cross_budget_squeezenet.json").read_text())
    assert data["rows"][-1] == ONNXRUNTIME and data["robust"] in data["tune_at"]
    assert max(data["max_rel_error"].values()) < 1e-4
    for name in ("cross_budget_squeezenet.png", "cross_budget_squeezenet-curves.png", "cross_budget_squeezenet-tasks.png",
                 "cross_budget_squeezenet.md"):  # fmt: skip
        assert (tmp_path / name).exists(), name


def test_vs_onnxruntime_script_quick(tmp_path):
    done = _script("vs_onnxruntime.py", "--out", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads((tmp_path / "vs_onnxruntime.json").read_text())["rows"]
    assert row["model"] == "encoder" and row["max_rel_error"] < 1e-4
    assert Store.open(tmp_path / "store").slots()  # the quick run tuned into its own store, not the user's


def test_encoder_matches_onnxruntime(tmp_path):
    model = resaware.load_onnx("zoo:encoder")
    assert [s.shape for s in model.inputs] == [(1, 128, 256)]
    compiled = resaware.compile(model, "100%", store=tmp_path)
    (x,) = model.random_inputs(0)
    (want,) = reference.outputs(model, [x])
    (got,) = compiled(x)
    assert float(abs(got - want).max() / abs(want).max()) < 1e-4
    (other,) = reference.outputs(model, model.random_inputs(1))
    assert abs(other - want).max() > 0.1  # the output depends on the input


def test_fault_injection_script_quick(tmp_path, small_path):
    done = _script("fault_injection.py", "--out", tmp_path, "--model", small_path, "--shape", "x=2x3x16x16")
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "fault_injection.json").read_text())
    assert data["ok"] and data["lost"] == 0 and len(data["kills"]) == 1 and len(data["interrupts"]) == 1
    assert data["corruption"]["loaded"] == data["corruption"]["good"]
    assert data["writers"]["loaded"] == data["writers"]["expected"]


def test_builder_overhead_script_quick(tmp_path):
    done = _script("builder_overhead.py", "--out", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "builder_overhead.json").read_text())
    assert data["batch_size"] == 2 and len(data["pooled_walls_s"]) == len(data["local_walls_s"]) == 1
    assert data["command"].endswith("--quick --out " + str(tmp_path))
    assert "ratio of batch wall time" in (tmp_path / "builder_overhead.md").read_text()


@two_cores
def test_tuning_speed_script_quick(tmp_path):
    done = _script(
        "tuning_speed.py", "--out", tmp_path, "--budget", "50%", "--contestants", "expert,resaware,resaware-k2"
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    data = json.loads((tmp_path / "tuning_speed-50pct.json").read_text())
    assert set(data["contestants"]) == {"expert", "resaware", "resaware-k2"}
    for contestant in data["contestants"].values():
        assert contestant["stopped_by"] in {"trials", "cap"} and contestant["trials"] > 0
        assert contestant["final_latency_ms"] > 0 and contestant["max_rel_error"] < 1e-4
        seconds, trials, _ = zip(*contestant["curve"])
        assert list(seconds) == sorted(seconds) and list(trials) == sorted(trials)
        # The profiler's phases fit in the clients' time; every measured trial was built and run.
        phases = contestant["phases"]
        assert (
            sum(v for k, v in phases.items() if k != "other") <= contestant["wall_s"] * contestant["concurrency"] * 1.01
        )
        assert phases["build"] > 0 and phases["run"] > 0 and phases["search"] > 0 and contestant["measure_rate"] > 0
    two = data["contestants"]["resaware-k2"]
    assert two["concurrency"] == 2 and sorted(c["measure"] for c in two["clients"]) == [[0], [1]]
    table = (tmp_path / "tuning_speed-50pct.md").read_text()
    assert "measuring rate, 2 clients / 1" in table and "where resaware x2 ran" in table
    assert (tmp_path / "tuning_speed-50pct.png").exists() and "stock expert" in table


@two_cores
def test_concurrent_measurement_script_quick(tmp_path):
    done = _script("concurrent_measurement.py", "--out", tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    data = json.loads((tmp_path / "concurrent_measurement.json").read_text())
    assert data["partitions"] == [[1], [0]] and data["candidates"] >= 2
    rows = data["arrangements"]
    assert set(rows) == {"alone", "k workers", "beside builds"}
    assert all(row["throughput"] > 0 and 0.3 < row["median_ratio"] < 3 for row in rows.values())
    assert "good picks" in (tmp_path / "concurrent_measurement.md").read_text()


def test_roofline_script_quick(tmp_path, squeezenet_store):
    store, _ = squeezenet_store
    done = _script("roofline.py", "--out", tmp_path, "--store", store, "--budget", "50%")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    data = json.loads((tmp_path / "roofline-squeezenet-50pct.json").read_text())
    peak = data["fma_peak"]["gflops"]
    assert data["cores"] == len(data["fma_peak"]["per_core"]) and data["fma_peak"]["vector_bits"] in (256, 512)
    # Neither a hand-written sgemm nor any runtime can beat the measured peak on the model's direct
    # convolutions: if one did, the peak loop or the FLOP count would be wrong, and so the floor.
    assert 0 < data["sgemm"]["gflops"] <= 1.05 * peak
    assert data["floor_ms"] < data["onnxruntime_ms"] and data["floor_ms"] < data["module_ms"]
    assert 0.6 < data["gflop"] < 0.8 and data["conv_matmul_share"] > 0.95  # SqueezeNet 1.1: 0.35 GMAC
    assert data["max_rel_error"] < 1e-4 and len(data["kernels"]) == data["tasks"] == 30
    assert "(the floor)" in (tmp_path / "roofline-squeezenet-50pct.md").read_text()


def _two_convs(path, seed: int = 3) -> str:
    """Conv -> Relu -> Conv, fixed shapes: two kernels, both tunable (no reshape that MetaSchedule skips);
    `seed` draws the weights."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype("float32"), name)
               for name, shape in (("w1", (8, 3, 3, 3)), ("w2", (4, 8, 3, 3)))]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]  # fmt: skip
    graph = helper.make_graph(nodes, "two_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return str(path)


@two_cores
def test_transfer_script_quick(tmp_path):
    model = _two_convs(tmp_path / "two_convs.onnx")
    done = _script("transfer.py", "--out", tmp_path, "--models", model, "--work", tmp_path / "work")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    data = json.loads((tmp_path / "transfer_two_convs.json").read_text())
    step = data["step"]
    # Two convolutions and, in NHWC, the transposes into and out of it; four candidates per task a step.
    assert data["tasks"] == 4 and step == 16
    for row in data["rows"]:  # one step each: the cold start reaches its own final by its last record
        assert row["cold_trials"] == row["warm_trials"] == step and 0 < row["cold_to_5pct"] <= step
        assert row["donor"] == {"50%": "100%", "100%": "50%"}[row["budget"]] and row["cold_final_ms"] > 0
    warm = data["runs"]["warm@50%"]
    assert len(warm["curve"]) == step and warm["curve"][-1][1] > 0
    models = {(r["budget"], r["model"]) for r in data["ranking"]}
    assert len(models) == 8 and all(r["pairwise"] is None or 0 <= r["pairwise"] <= 1 for r in data["ranking"])
    assert "trials to come within 5%" in (tmp_path / "transfer_two_convs.md").read_text()
    timed = _script("transfer.py", "--out", tmp_path, "--models", model, "--work", tmp_path / "work", "--time-modules")
    assert timed.returncode == 0, (timed.stdout + timed.stderr)[-3000:]
    rows = json.loads((tmp_path / "transfer_modules.json").read_text())["rows"]
    assert [r["budget"] for r in rows] == ["50%", "100%"] and all(r["cold_ms"] > 0 and r["warm_ms"] > 0 for r in rows)


@two_cores
def test_time_to_quality_script_quick(tmp_path):
    model, work = _two_convs(tmp_path / "two_convs.onnx"), tmp_path / "work"
    done = _script("time_to_quality.py", "--out", tmp_path, "--model", model, "--budget", "50%", "--keep", work)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    first = json.loads((tmp_path / "time_to_quality-two_convs-50pct.json").read_text())
    assert first["onnxruntime_ms"] > 0 and first["untuned_ms"] > 0
    for contestant in first["contestants"].values():
        # Bounded by time alone: stopped by the cap, one module at the 0.5-minute mark and one at the end.
        assert contestant["stopped_by"] == "cap" and contestant["trials"] > 0
        marks, trials, ms = zip(*contestant["quality"])
        assert marks[0] == 30 and marks[1] == contestant["wall_s"] >= 60
        assert trials[0] <= trials[1] == contestant["trials"] and min(ms) > 0
        assert contestant["ratio_to_ort"]["0.5"] == pytest.approx(ms[0] / first["onnxruntime_ms"])
        assert contestant["max_rel_error"] < 1e-4
    # Every batch is small enough for the first round to reach both kernels in the first half-minute.
    assert all(t[1] <= 16 for t in first["contestants"]["resaware"]["curve"][:2])
    table = (tmp_path / "time_to_quality-two_convs-50pct.md").read_text()
    assert "over the first 1 min: trials per minute, resaware / stock expert" in table and "ONNX Runtime" in table
    assert (tmp_path / "time_to_quality-two_convs-50pct.png").exists()

    # Half a minute more for resaware: stock's run is reused, resaware's goes on from its store.
    done = _script("time_to_quality.py", "--out", tmp_path, "--model", model, "--budget", "50%", "--keep", work,
                   "--minutes", "1.5", "--stock-minutes", "1")  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "stock expert: reusing the finished run" in done.stdout and "going on from" in done.stdout
    then = json.loads((tmp_path / "time_to_quality-two_convs-50pct.json").read_text())
    stock, ours, ours_before = (
        then["contestants"]["expert"],
        then["contestants"]["resaware"],
        first["contestants"]["resaware"],
    )
    assert (
        stock["trials"] == first["contestants"]["expert"]["trials"]
        and stock["curve"] == first["contestants"]["expert"]["curve"]
    )
    assert ours["resumed_at"] == [pytest.approx(ours_before["wall_s"])] and ours["trials"] > ours_before["trials"]
    # One clock and one count across both runs: the second run's points follow the first's.
    assert ours["curve"][: len(ours_before["curve"])] == ours_before["curve"]
    later = ours["curve"][len(ours_before["curve"]) :]
    assert later and later[0][0] > ours_before["wall_s"] and later[0][1] > ours_before["trials"]
    assert ours["wall_s"] >= 90 and ours["curve"][-1][1] == ours["trials"]
    # Stock's end is a mark of resaware's longer run: both are compared over the same minute.
    assert set(ours["at_minutes"]) == {"0.5", "1", "1.5"} and set(stock["at_minutes"]) == {"0.5", "1"}
    table = (tmp_path / "time_to_quality-two_convs-50pct.md").read_text()
    assert "resaware was tuned in 2 runs" in table and "over the first 1 min" in table


def test_layout_script_quick(tmp_path):
    model = _two_convs(tmp_path / "two_convs.onnx")
    done = _script("layout.py", "--out", tmp_path, "--model", model, "--budget", "50%")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    data = json.loads((tmp_path / "layout-two_convs-50pct.json").read_text())
    assert data["onnxruntime_ms"] > 0 and list(data["layouts"]) == ["NCHW", "NHWC"]
    for layout, arm in data["layouts"].items():
        # Each arm was compiled in its own layout, from its own records, and matches ONNX Runtime.
        assert arm["layout"] == layout and arm["trials"] > 0 and arm["latency_ms"] > 0 and arm["rel_error"] < 1e-4
    assert "NHWC" in (tmp_path / "layout-two_convs-50pct.md").read_text()


def test_layout_script_tunes_each_layout_for_the_trials_asked(tmp_path):
    # --conv: one 3x3 convolution, written by the script (the single-kernel comparison of Winograd).
    done = _script("layout.py", "--out", tmp_path, "--conv", "8,4,16", "--layouts", "NHWC,NHWC-winograd", "--trials", 4)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    data = json.loads((tmp_path / "layout-conv8-4-16-50pct-nhwc-nhwc-winograd-4trials.json").read_text())
    assert data["trials"] == 4 and list(data["layouts"]) == ["NHWC", "NHWC-winograd"] and data["conv"] == "8,4,16"
    for layout, arm in data["layouts"].items():
        assert arm["layout"] == layout and 4 <= arm["trials"] <= 8 and arm["rel_error"] < 1e-4


def test_cache_flush_script_quick(tmp_path):
    done = _script("cache_flush.py", "--out", tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    data = json.loads((tmp_path / "cache_flush-squeezenet-50pct.json").read_text())
    (result,) = data["results"]  # SqueezeNet's kernel with the most weight bytes, tuned warm, re-timed both ways
    assert result["weight_kb"] > 0 and 1 <= len(result["candidates"]) <= 4
    assert all(c["warm"] > 0 and c["flushed"] > 0 for c in result["candidates"])
    assert result["task"] in (tmp_path / "cache_flush-squeezenet-50pct.md").read_text()


def test_kernel_context_script_quick(tmp_path, squeezenet_store):
    store, _ = squeezenet_store
    done = _script("kernel_context.py", "--out", tmp_path, "--store", store, "--budget", "100%", "--watch", "2")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    data = json.loads((tmp_path / "kernel_context-squeezenet-100pct.json").read_text())
    calls = data["calls"]
    # Every kernel launch of the model, convolutions first among them, each timed three ways.
    # In launch order: the input's transpose into NHWC, then the stem convolution.
    assert (
        len(calls) >= 30
        and calls[0]["kernel"].startswith("transpose")
        and calls[1]["kernel"].startswith("fused_conv2d")
    )
    assert all(c[k] > 0 for c in calls for k in ("alone_s", "after_producer_s", "in_model_s"))
    # The kernels timed inside the model are where the module's time goes.
    assert 0.5 < sum(c["in_model_s"] for c in calls) / data["module_s"] < 1.5
    # Kernels are matched to their tasks' records in the store the module was compiled from.
    cores = len(confine.usable_cores())
    assert data["slot"] == f"cpu-{cores}of{cores}" and any(c["recorded_s"] for c in calls)
    assert "in the model / alone" in (tmp_path / "kernel_context-squeezenet-100pct.md").read_text()
    # With two cores the probe runs on either side of the timing child and after each watched timing.
    two = cores > 1
    assert len(data["round_trip_ns"]) == (2 if two else 0) and all(ns > 0 for ns in data["round_trip_ns"])
    assert len(data["watch"]) == (2 if two else 0) and all(ns > 0 and ms > 0 for ns, ms in data["watch"])


def test_retime_script_quick(tmp_path):
    model = _two_convs(tmp_path / "two_convs.onnx")
    paths = {}
    for layout in ("NCHW", "NHWC"):
        compiled = resaware.compile(resaware.load_onnx(model, layout=layout), "50%", store=tmp_path / "empty")
        paths[layout] = compiled.export(tmp_path / f"{layout}.so")
    modules = [f"{label}={path}" for label, path in paths.items()]
    done = _script("retime.py", "--out", tmp_path, "--model", model, "--budget", "50%", *modules)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    data = json.loads((tmp_path / "retime-two_convs-50pct-nchw-nhwc.json").read_text())
    arms = data["arms"]
    assert list(arms) == ["NCHW", "NHWC", "ONNX Runtime"] and arms["ONNX Runtime"]["median_ms"] > 0
    for layout in ("NCHW", "NHWC"):
        # Each module is the one given (its own layout), checked against ONNX Runtime, then timed.
        assert arms[layout]["layout"] == layout and arms[layout]["max_rel_error"] < 1e-4
        assert arms[layout]["median_ms"] > 0 and len(arms[layout]["rounds_ms"]) == 1
    assert "NHWC" in (tmp_path / "retime-two_convs-50pct-nchw-nhwc.md").read_text()


def test_retime_refuses_a_module_of_another_model(tmp_path):
    model = _two_convs(tmp_path / "two_convs.onnx")
    other = _two_convs(tmp_path / "other.onnx", seed=4)  # same graph and shapes, other weights
    compiled = resaware.compile(resaware.load_onnx(other), "50%", store=tmp_path / "empty")
    path = compiled.export(tmp_path / "other.so")
    done = _script("retime.py", "--out", tmp_path, "--model", model, "--budget", "50%", f"other={path}")
    # Checked before anything is timed: one line naming the module, and nothing written.
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("other: outputs differ from ONNX Runtime")
    assert not list(tmp_path.glob("retime-*"))
