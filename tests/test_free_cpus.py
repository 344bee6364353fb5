"""The default thread count follows the CPUs that other processes leave free (process/free_cpus.py),
and a step's logits do not depend on how many threads run it."""

import os

import numpy as np
import pytest

from fuelcli.backends import make_engine
from fuelcli.process import free_cpus as fc
from fuelcli.backends.cpu.activations import attention_splits
from fuelcli.backends.cpu.attention import KEY_BLOCK, MIN_SPLIT_BLOCKS
from fuelcli.process import threads
from fuelcli.assembly.loader import open_model


class Machine:
    """A fake /proc/stat, process CPU time and clock."""

    def __init__(self, cpus):
        self.cpus, self.t, self.busy, self.own = cpus, 0.0, 0.0, 0.0

    def run(self, seconds, ours, others):
        """`seconds` pass with `ours` cores busy with this process and `others` with other processes."""
        self.t += seconds
        self.own += ours * seconds
        self.busy += (ours + others) * seconds

    def free(self, pool):
        return fc.FreeCpus(pool, stat=lambda: (self.cpus, self.busy), own=lambda: self.own, clock=lambda: self.t)


def usable():
    try:
        return len(os.sched_getaffinity(0)) == os.cpu_count()
    except AttributeError:
        return False


@pytest.mark.skipif(not usable(), reason="a CPU mask: FreeCpus stays off")
def test_threads_follow_the_cpus_other_processes_keep_busy():
    m = Machine(os.cpu_count())
    f = m.free(2)
    assert f.on and f.threads() == 2
    m.run(1.0, 2, 0)  # quiet: both cores are ours
    assert f.threads() == 2
    m.run(1.0, 4 / 3, 2 / 3)  # another process takes a core: ours got two thirds of each
    assert f.threads() == 1
    m.run(fc.WINDOW / 2, 1, 1)  # within a window: no new reading
    assert f.threads() == 1
    m.run(1.0, 1, 1)  # still there: one thread on the core left
    assert f.threads() == 1
    m.run(1.0, 2, 0.2)  # it left (a little background remains)
    assert f.threads() == 2


def test_off_where_proc_stat_counts_other_cpus():
    """A container on a larger host: /proc/stat counts the host's CPUs, whose load is not ours to
    follow (the negative control: the same readings as above leave the count alone)."""
    m = Machine(os.cpu_count() + 4)
    f = m.free(2)
    m.run(1.0, 1, 5)
    assert not f.on and f.threads() == 2
    assert not fc.FreeCpus(1).on  # one thread has nothing to give up


@pytest.mark.skipif(threads.pool_size() < 2, reason="needs a pool of 2 threads")
def test_logits_do_not_depend_on_the_threads_running(smollm2_gguf):
    """Decode deep enough that the attention runs in key runs, on 1 and on 2 threads: bit for bit.
    The runs' number comes from the pool, not the threads running now; a scratch sized for another
    number of runs moves the last bits (the negative control: the comparison sees that)."""
    m = open_model(str(smollm2_gguf))
    depth = 2 * MIN_SPLIT_BLOCKS * KEY_BLOCK + 5
    assert attention_splits(m.cfg, threads.pool_size()) >= 2
    ids = (np.arange(depth + 1) * 37 + 11) % m.cfg.vocab_size
    engine = make_engine(m.cfg, m.weights, n_ctx=depth + 8)
    engine.free_cpus = None
    engine.prefill(ids[:-1])
    got = []
    for n in (1, 2, 1):
        threads.use(n)
        engine.rewind(depth)
        got.append(engine.decode(int(ids[-1])))
    threads.use(threads.pool_size())
    assert np.array_equal(got[0], got[1]) and np.array_equal(got[1], got[2])
    one_run = make_engine(m.cfg, m.weights, n_ctx=depth + 8)
    part = one_run.act.part
    one_run.act = one_run.act._replace(part=part[: part.size // attention_splits(m.cfg, threads.pool_size())])
    one_run.prefill(ids[:-1])
    other = one_run.decode(int(ids[-1]))
    assert not np.array_equal(other, got[1]) and np.abs(other - got[1]).max() < 1e-2  # measured 3.8e-3
