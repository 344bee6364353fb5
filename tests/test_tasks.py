"""run_tasks (matmul.py): threads take tasks one by one from one counter, or (decode) a contiguous
region each, in order, and then help with the other threads' regions.

The test kernel's task 0 waits until every other task has run, and each task notes when it started
(a shared sequence number). Either way another thread runs every other task while task 0 waits (a
held thread holds nothing behind it); taken by regions, the second thread starts at the middle of
the tasks and runs its region in order, taken one by one it starts at task 1 (the control: the
test tells the two apart).
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
from fuelcli.backends.cpu.matmul import run_tasks

N_TASKS = 64
SEEN_ALL, GAVE_UP = 1, 2


def _build():
    """task(t, done, flags, n, patience, order, seq): order[t] = the next sequence number; task 0
    then polls `done` until the other n - 1 tasks have counted themselves in, or `patience` polls
    have passed; flags[t] says how each task ended."""
    mod = ir.Module("fuel_test_tasks")
    fn, bd = func(mod, "fuel_test_wait_for_the_rest", TASK_ARGS)
    t, done_, flags_, n, patience, order_, seq_ = fn.args[:7]
    done, flags = ptr_to(bd, done_, I64), ptr_to(bd, flags_, I64)
    bd.store(bd.atomic_rmw("add", ptr_to(bd, seq_, I64), c64(1), "acq_rel"), bd.gep(ptr_to(bd, order_, I64), [t]))
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


def _run(one_by_one, patience=10**10):  # seconds at most; the other thread needs microseconds
    fn = compile_module("test_tasks", _build, host_isa())["fuel_test_wait_for_the_rest"]
    done, flags = np.zeros(1, np.int64), np.zeros(N_TASKS, np.int64)
    order, seq = np.full(N_TASKS, -1, np.int64), np.zeros(1, np.int64)
    args = tuple(np.int64(a) for a in (done.ctypes.data, flags.ctypes.data, N_TASKS, patience, order.ctypes.data,
                                        seq.ctypes.data)) + (np.int64(0),) * 5
    run_tasks(fn, N_TASKS, args, one_by_one)
    return done[0], flags, order


@pytest.fixture(autouse=True)
def two_threads():
    """Two threads for the parallel loop (another test may have set this thread's count to one)."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs a pool of two threads")
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    yield
    numba.set_num_threads(before)


@pytest.mark.parametrize("one_by_one", [True, False])
def test_a_held_thread_holds_no_task_behind_it(one_by_one):
    done, flags, order = _run(one_by_one)
    assert done == N_TASKS - 1
    assert flags.tolist() == [SEEN_ALL] * N_TASKS
    assert sorted(order.tolist()) == list(range(N_TASKS))  # each task once


def test_regions_run_in_order_from_the_middle():
    """Decode: the thread not held starts at the middle (the second region, task N/2 among the
    first two tasks begun), runs it in order, then the first region's rest in order; one by one
    it starts at task 1 (the control)."""
    half = N_TASKS // 2
    *_, order = _run(False)
    assert order[half] <= 1
    second, first = order[half:].tolist(), order[1:half].tolist()
    assert second == sorted(second) and first == sorted(first) and min(first) > max(second)
    *_, order = _run(True)
    assert order[half] > 1


@njit(cache=True)
def _count():
    return thread_count()


def test_thread_count_is_numbas_count_for_this_thread():
    """Regions are sized from thread_count: numba's own count, as set for the calling thread; a
    function that calls it can be cached (numba warns when it cannot: numba.get_num_threads())."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", NumbaWarning)
        _count()
    for n in (1, 2):
        numba.set_num_threads(n)
        assert _count() == numba.get_num_threads() == n
