"""run_tasks (matmul.py): threads take tasks one by one, or in runs sized from the thread count.

The test kernel's task 0 waits until every other task has run. Taken one by one, another thread
runs them all while task 0 waits; taken in runs, the tasks after task 0 in its own run cannot
start, so task 0 gives up (the negative control: the test tells the two apart).
"""

import warnings

import numba
import numpy as np
import pytest
from numba import njit
from numba.core.errors import NumbaWarning
from llvmlite import ir

from fuelcli.backends.cpu.core import TASK_ARGS
from fuelcli.backends.cpu.irgen import I64, c64, func, ptr_to
from fuelcli.backends.cpu.llvm import compile_module, host_isa, thread_count
from fuelcli.backends.cpu.matmul import CHUNKS, run_tasks

N_TASKS = 64  # runs of N_TASKS // (CHUNKS * 2) = 4 tasks with two threads
SEEN_ALL, GAVE_UP = 1, 2


def _build():
    """task(t, done, flags, n, patience): task 0 polls `done` until the other n - 1 tasks have
    counted themselves in, or `patience` polls have passed; flags[t] says how each task ended."""
    mod = ir.Module("fuel_test_tasks")
    fn, bd = func(mod, "fuel_test_wait_for_the_rest", TASK_ARGS)
    t, done_, flags_, n, patience = fn.args[:5]
    done, flags = ptr_to(bd, done_, I64), ptr_to(bd, flags_, I64)
    rest = bd.sub(n, c64(1))
    with bd.if_else(bd.icmp_signed("==", t, c64(0))) as (first, other):
        with first:
            entry = bd.block
            poll, out = bd.append_basic_block("poll"), bd.append_basic_block("out")
            bd.branch(poll)
            bd.position_at_end(poll)
            i = bd.phi(I64)
            i.add_incoming(c64(0), entry)
            i.add_incoming(bd.add(i, c64(1)), poll)
            seen = bd.icmp_signed(">=", bd.load_atomic(done, "acquire", 8), rest)
            bd.cbranch(bd.or_(seen, bd.icmp_signed(">=", i, patience)), out, poll)
            bd.position_at_end(out)
            bd.store(bd.select(seen, c64(SEEN_ALL), c64(GAVE_UP)), flags)
        with other:
            bd.store(c64(SEEN_ALL), bd.gep(flags, [t]))
            bd.atomic_rmw("add", done, c64(1), "release")
    bd.ret_void()
    return mod, [fn.name]


def _run(one_by_one, patience):
    fn = compile_module("test_tasks", _build, host_isa())["fuel_test_wait_for_the_rest"]
    done, flags = np.zeros(1, np.int64), np.zeros(N_TASKS, np.int64)
    args = tuple(np.int64(a) for a in (done.ctypes.data, flags.ctypes.data, N_TASKS, patience)) + (np.int64(0),) * 7
    run_tasks(fn, N_TASKS, args, one_by_one)
    return done[0], flags


@pytest.fixture(autouse=True)
def two_threads():
    """Two threads for the parallel loop (another test may have set this thread's count to one)."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs a pool of two threads")
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    yield
    numba.set_num_threads(before)


def test_threads_take_the_tasks_one_thread_is_held_on():
    done, flags = _run(True, patience=10**10)  # seconds at most; the other thread needs microseconds
    assert done == N_TASKS - 1
    assert flags.tolist() == [SEEN_ALL] * N_TASKS


def test_runs_hold_the_tasks_behind_the_waiting_one():
    """The negative control: the thread that takes tasks 0..3 holds 1..3 behind task 0, which
    gives up; every task still runs once."""
    assert N_TASKS // (CHUNKS * 2) > 1
    done, flags = _run(False, patience=10**8)
    assert done == N_TASKS - 1
    assert flags[0] == GAVE_UP and flags[1:].tolist() == [SEEN_ALL] * (N_TASKS - 1)


@njit(cache=True)
def _count():
    return thread_count()


def test_thread_count_is_numbas_count_for_this_thread():
    """Runs are sized from thread_count: numba's own count, as set for the calling thread; a
    function that calls it can be cached (numba warns when it cannot: numba.get_num_threads())."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", NumbaWarning)
        _count()
    for n in (1, 2):
        numba.set_num_threads(n)
        assert _count() == numba.get_num_threads() == n
