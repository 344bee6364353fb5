"""The process fuel runs in and the installation it runs from.

    threads.py      numba's threading, set before numba is first imported
    free_cpus.py    the CPUs other processes leave free (the default thread count follows them)
    collector.py    Python's cyclic garbage collector, off while a command starts
    memory.py       resident and available memory
    panic_guard.py  native calls that may panic (tokenizers), descriptor 2 kept quiet
    extras.py       the distribution's name on PyPI and what each extra adds
"""
