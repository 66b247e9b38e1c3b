"""Measuring workers are really confined: every thread's mask, and where the threads actually ran."""

import os

import numpy as np
import pytest
from conftest import two_cores

from resaware import confine, measure


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
