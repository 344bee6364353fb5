"""The numba.cuda backend (`--device cuda`): the same decoder as backends/cpu, its kernels written
for a GPU. Importing this package imports nothing from numba.cuda; `engine.CudaEngine` checks that
the CUDA packages, a driver and a GPU are there (runtime.require) before it loads any kernel.

    runtime.py          availability check (errors.MissingDependency, exit 4), launch shapes
    device_weights.py   the weights on the device, packed as stored, and their tables
    activations.py      device activations, allocated once per engine
    engine.py           CudaEngine: decode (matvec) and prefill (tiled matmul) forwards
    kernels/            unpack (one unit decoder per format), matvec, matmul, attention, moe, rows
"""
