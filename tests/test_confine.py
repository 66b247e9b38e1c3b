"""Measuring workers are really confined: every thread's mask, and where the threads actually ran."""

import os

import numpy as np
import pytest
from conftest import two_cores, two_physical_cores

from resaware.platform import confine
from resaware.tuning import measure


@two_cores
@pytest.mark.parametrize("cores", [(1,), (0, 1)])
def test_runner_worker_threads_stay_on_budget_cores(cores):
    runner = measure.ConfinedRunner(cores)
    try:
        state = runner.call(measure._spin, 1.5)
    finally:
        runner.close()
    assert state["pid"] != os.getpid()
    assert len(state["masks"]) >= 2  # TVM's pool and Python's threads, not just the main thread
    for tid, mask in state["masks"].items():
        assert mask == list(cores), f"thread {tid} may run on {mask}"
    assert state["ran_on"]  # some thread was seen working
    for tid, ran_on in state["ran_on"].items():
        assert set(ran_on) <= set(cores), f"thread {tid} ran on {ran_on}"
    assert state["env"] == {
        "TVM_NUM_THREADS": str(len(cores)),
        "TVM_BIND_THREADS": "0",
        "OMP_NUM_THREADS": str(len(cores)),
    }


@two_cores
def test_pinned_restores_every_thread():
    before = confine.thread_masks()
    with confine.pinned([0]):
        assert all(mask == {0} for mask in confine.thread_masks().values())
    after = confine.thread_masks()
    # Threads of earlier tests' pools may end meanwhile; every thread that lived through it is restored.
    survivors = set(before) & set(after)
    assert os.getpid() in survivors
    assert {tid: after[tid] for tid in survivors} == {tid: before[tid] for tid in survivors}


def test_in_process_run_keeps_callers_affinity(small_model, small_store):
    import resaware

    store, _ = small_store
    before = confine.thread_masks()[os.getpid()]
    compiled = resaware.compile(small_model, budget="50%", store=store)
    compiled(*small_model.random_inputs(0))
    assert confine.thread_masks()[os.getpid()] == before
    assert all(mask <= set(confine.usable_cores()) for mask in confine.thread_masks().values())
    assert np.isfinite(compiled(*small_model.random_inputs(1))[0]).all()


@two_cores
@two_physical_cores
def test_the_tuner_keeps_off_the_measuring_core_while_a_batch_is_timed():
    """With a core of its own besides the measuring one, the tuner gets the batch's futures at once and,
    until the batch is timed, it and its build workers keep to that core; then they take both back."""
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from resaware.platform import hardware

    target = hardware.llvm_target(1)
    a = te.placeholder((1 << 20,), name="a")
    mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute(a.shape, lambda i: a[i] * 2.0 + 1.0)])})
    artifacts = [measure.build_one(mod, target)]
    # Six flushed timings of a 4 MB kernel, each at least 3 x 40 ms: about a second and a half in all.
    inputs = [RunnerInput(artifacts[0], "cpu", ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True))] * 6
    lanes = measure.TunerCores((0, 1), (0,))
    runner = measure.ConfinedRunner((0,), measure.Timing(), lanes)
    builder = measure.PooledBuilder((0, 1), workers=1, lanes=lanes)

    def build_worker_masks() -> list[list[int]]:
        artifacts.append(builder.build([ms.builder.BuilderInput(mod, target)])[0].artifact_path)
        return list(builder.pool.submit(measure.worker_state).result()["masks"].values())

    try:
        with confine.pinned((0, 1)):
            futures = runner.run(inputs)
            assert not all(f.done() for f in futures)
            assert all(mask == {1} for mask in confine.thread_masks().values())
            assert all(mask == [1] for mask in build_worker_masks())  # a build started while measuring
            results = [f.result() for f in futures]
            assert runner.batch_done.wait(10)
            assert all(mask == {0, 1} for mask in confine.thread_masks().values())
            assert all(mask == [0, 1] for mask in build_worker_masks())
    finally:
        runner.close()
        builder.close()
        for path in filter(None, artifacts):
            measure.remove_artifact(path)
    assert artifacts[1:] and all(artifacts)  # both builds succeeded
    assert all(r.error_msg is None and len(r.run_secs) == 3 and min(map(float, r.run_secs)) > 0 for r in results)
