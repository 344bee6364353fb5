"""Python's cyclic garbage collector, off while a command starts.

A start leaves ~185k tracked objects that live as long as the process (numba's typing registries,
the tokenizer's inputs, a 151k-token vocabulary's merges) and next to no garbage cycles: on a warm
`fuel run` of the Qwen demo the collector ran ~500 times, freed ~1,000 objects and cost ~0.15 s of
a 1.2 s wait for the first token. So main() pauses it before the first import, and it resumes once
the start is over: `run`, `chat` and `serve` when their engine is ready, every other command as it
begins (cli/app.py). Resuming freezes what is alive by then (gc.freeze): later collections skip it.
Compiling the kernels (the first run) leaves ~80 MB of cycles, collected once before the freeze.
Code that imports fuel as a library never pauses it.
"""

import gc

_paused = False


def pause():
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume(collect: bool = False):
    """Collect as usual again (a no-op unless pause() turned the collector off); collect=True
    first frees the cycles the start left (a start that compiled code)."""
    global _paused
    if _paused:
        _paused = False
        if collect:
            gc.collect()
        gc.freeze()
        gc.enable()
