"""One entry for every weight format: `unpack(code, w8, p, k0, out)` decodes UNIT elements.

`code` is `Format.code` (a runtime int: one kernel serves every format, and a model may mix them);
each branch is the format's unit decoder (floats.py, legacy.py, k_quants.py, i_quants.py,
ternary.py). A format the registry gains without a branch here is caught by the import-time check
below.
"""

from numba import cuda

from ....formats import BY_CODE
from .floats import LBF16, LF16, LF32, unpack_bf16, unpack_f16, unpack_f32
from .i_quants import (LIQ1M, LIQ1S, LIQ2S, LIQ2XS, LIQ2XXS, LIQ3S, LIQ3XXS, LIQ4NL, LIQ4XS, LMXFP4, unpack_iq1_m,
                       unpack_iq1_s, unpack_iq2_s, unpack_iq2_xs, unpack_iq2_xxs, unpack_iq3_s, unpack_iq3_xxs,
                       unpack_iq4_nl, unpack_iq4_xs, unpack_mxfp4)
from .k_quants import L2K, L3K, L4K, L5K, L6K, unpack_q2_k, unpack_q3_k, unpack_q4_k, unpack_q5_k, unpack_q6_k
from .legacy import L8, L40, L41, L50, L51, unpack_q4_0, unpack_q4_1, unpack_q5_0, unpack_q5_1, unpack_q8_0
from .ternary import LTQ1, LTQ2, unpack_tq1_0, unpack_tq2_0

HANDLED = {L.code for L in (LF32, LF16, LBF16, L8, L40, L41, L50, L51, L2K, L3K, L4K, L5K, L6K, LIQ4NL, LIQ4XS, LIQ3XXS,
                             LIQ3S, LIQ2XXS, LIQ2XS, LIQ2S, LIQ1S, LIQ1M, LTQ2, LTQ1, LMXFP4)}
assert HANDLED == {f.code for f in BY_CODE}, "a format in fuelcli/formats has no CUDA unit decoder"


@cuda.jit(device=True)
def unpack(code, w8, p, k0, out):
    """out[0:UNIT] = elements k0..k0+UNIT-1 of the row at byte p of w8, as float32."""
    if code == L4K.code:
        unpack_q4_k(w8, p, k0, out)
    elif code == L6K.code:
        unpack_q6_k(w8, p, k0, out)
    elif code == LIQ3XXS.code:
        unpack_iq3_xxs(w8, p, k0, out)
    elif code == LIQ3S.code:
        unpack_iq3_s(w8, p, k0, out)
    elif code == LIQ2XXS.code:
        unpack_iq2_xxs(w8, p, k0, out)
    elif code == LIQ2XS.code:
        unpack_iq2_xs(w8, p, k0, out)
    elif code == LIQ2S.code:
        unpack_iq2_s(w8, p, k0, out)
    elif code == LIQ1S.code:
        unpack_iq1_s(w8, p, k0, out)
    elif code == LIQ1M.code:
        unpack_iq1_m(w8, p, k0, out)
    elif code == LTQ2.code:
        unpack_tq2_0(w8, p, k0, out)
    elif code == LTQ1.code:
        unpack_tq1_0(w8, p, k0, out)
    elif code == LMXFP4.code:
        unpack_mxfp4(w8, p, k0, out)
    elif code == LIQ4NL.code:
        unpack_iq4_nl(w8, p, k0, out)
    elif code == LIQ4XS.code:
        unpack_iq4_xs(w8, p, k0, out)
    elif code == L3K.code:
        unpack_q3_k(w8, p, k0, out)
    elif code == L2K.code:
        unpack_q2_k(w8, p, k0, out)
    elif code == L5K.code:
        unpack_q5_k(w8, p, k0, out)
    elif code == L50.code:
        unpack_q5_0(w8, p, k0, out)
    elif code == L51.code:
        unpack_q5_1(w8, p, k0, out)
    elif code == L8.code:
        unpack_q8_0(w8, p, k0, out)
    elif code == L41.code:
        unpack_q4_1(w8, p, k0, out)
    elif code == L40.code:
        unpack_q4_0(w8, p, k0, out)
    elif code == LBF16.code:
        unpack_bf16(w8, p, k0, out)
    elif code == LF16.code:
        unpack_f16(w8, p, k0, out)
    else:
        unpack_f32(w8, p, k0, out)
