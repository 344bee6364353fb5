"""The read-bandwidth probe's kernel (backends/cuda/bandwidth.py): the roofline's denominator."""

from numba import cuda, uint32

from .ptxops import ldg4


@cuda.jit
def read_xor(buf, n4, passes, out):
    """XOR of the uint32 words buf[:4 * n4], read `passes` times in 16-byte read-only loads
    (grid-stride), into out[thread]: every load feeds the result, so none can be dropped."""
    t = cuda.grid(1)
    stride = cuda.gridsize(1)
    acc = uint32(0)
    for _ in range(passes):
        i = t
        while i < n4:
            a, b, c, d = ldg4(buf, i * 4)
            acc ^= a ^ b ^ c ^ d
            i += stride
    out[t] = acc
