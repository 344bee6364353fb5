"""Loads and bit casts that numba.cuda does not offer, each a plain Python function (what the
simulator runs) with an NVVM lowering for the real target (inline PTX):

    ldg4(a, i)       a[i:i + 4] of a 1-D uint32 or float32 array as one 16-byte load through the
                     read-only cache (ld.global.nc.v4): i must be a multiple of 4 and a's data 16-byte
                     aligned (device allocations are 256-byte aligned; the weight buffer aligns rows)
    ldg(a, i)        a[i] through the read-only cache (ld.global.nc)
    ldl2(a, i)       a[i] from L2, past this multiprocessor's L1 (ld.global.cg): for data that other
                     blocks of the same launch wrote (matvec.py's last-block epilogue)
    f32_bits(u)      the float32 whose bits are the uint32 u (a register move)

The read-only path is for data no thread of the launch writes (the weights, the normed activations).
"""

import numpy as np
from numba.core import config

SIM = bool(config.ENABLE_CUDASIM)


def ldg4(a, i):
    return a[i], a[i + 1], a[i + 2], a[i + 3]


def ldg(a, i):
    return a[i]


def ldl2(a, i):
    return a[i]


def f32_bits(u):
    return np.uint32(u).view(np.float32)


if not SIM:  # the simulator runs the Python above
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic, overload

    _WORD = {types.uint32: ("u32", "r", ir.IntType(32)), types.float32: ("f32", "f", ir.FloatType())}

    def _pointer(context, builder, aryty, ary, i):
        array = context.make_array(aryty)(context, builder, value=ary)
        return cgutils.get_item_pointer(context, builder, aryty, array, [i], wraparound=False)

    @intrinsic
    def _ldg4(typingctx, a, i):
        if not (isinstance(a, types.Array) and a.ndim == 1 and a.dtype in _WORD and isinstance(i, types.Integer)):
            return None
        sig = types.UniTuple(a.dtype, 4)(a, i)

        def codegen(context, builder, sig, args):
            suffix, c, lt = _WORD[sig.args[0].dtype]
            fnty = ir.FunctionType(ir.LiteralStructType([lt] * 4), [lt.as_pointer()])
            asm = ir.InlineAsm(fnty, f"ld.global.nc.v4.{suffix} {{$0, $1, $2, $3}}, [$4];", f"={c},={c},={c},={c},l")
            r = builder.call(asm, [_pointer(context, builder, sig.args[0], args[0], args[1])])
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(r, k) for k in range(4)])

        return sig, codegen

    def _scalar_load(op):
        @intrinsic
        def load(typingctx, a, i):
            if not (isinstance(a, types.Array) and a.ndim == 1 and isinstance(i, types.Integer)
                    and a.dtype in (types.uint8, types.uint16, types.uint32, types.float32)):
                return None
            sig = a.dtype(a, i)

            def codegen(context, builder, sig, args):
                lt = context.get_value_type(sig.args[0].dtype)
                bits = sig.args[0].dtype.bitwidth
                kind = "f" if isinstance(sig.args[0].dtype, types.Float) else ("h" if bits == 16 else "r")
                reg = lt if bits > 8 else ir.IntType(32)  # PTX has no 8-bit registers: load into 32 bits
                fnty = ir.FunctionType(reg, [lt.as_pointer()])
                width = f"{'f' if kind == 'f' else 'u'}{bits}"
                asm = ir.InlineAsm(fnty, f"ld.global.{op}.{width} $0, [$1];", f"={kind},l")
                v = builder.call(asm, [_pointer(context, builder, sig.args[0], args[0], args[1])])
                return builder.trunc(v, lt) if reg is not lt else v

            return sig, codegen

        return load

    _ldg, _ldl2 = _scalar_load("nc"), _scalar_load("cg")

    @intrinsic
    def _f32_bits(typingctx, u):
        if not isinstance(u, types.Integer):
            return None
        sig = types.float32(u)

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.uint32)
            return builder.bitcast(v, ir.FloatType())

        return sig, codegen

    @overload(ldg4, target="cuda")
    def _ol_ldg4(a, i):
        return lambda a, i: _ldg4(a, i)

    @overload(ldg, target="cuda")
    def _ol_ldg(a, i):
        return lambda a, i: _ldg(a, i)

    @overload(ldl2, target="cuda")
    def _ol_ldl2(a, i):
        return lambda a, i: _ldl2(a, i)

    @overload(f32_bits, target="cuda")
    def _ol_f32_bits(u):
        return lambda u: _f32_bits(u)
