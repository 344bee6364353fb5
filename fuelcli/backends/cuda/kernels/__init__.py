"""numba.cuda kernels (importing any of these modules imports numba.cuda).

    common.py    UNIT, half-float decode, block sums
    floats.py legacy.py k_quants.py   one unit decoder per format, sizes from Format.layout
    unpack.py    the dispatch on Format.code
    dequant.py   whole rows (embedding lookup)
    matvec.py    decode products, with RMSNorm / bias / residual / SwiGLU fusions
    matmul.py    prefill tiled GEMM, weights decoded into shared memory
    attention.py QK-norm + RoPE + cache store; online-softmax attention with GQA and windows
    moe.py       routing (softmax, top-k, renorm), the chosen experts' SwiGLU and weighted sum
    rows.py      RMSNorm, SiLU * up, argmax
"""
