"""The per-format matrix kernels, generated as LLVM IR for one instruction set (llvm.py): the modules
that hold them, built, compiled (or loaded from the cache) on demand, and their addresses.

Three kernels per weight format, all `void f(i64, ...)` called by address from numba (matmul.py):

  decode(w, row_bytes, n_rows, K, x, xs, xf, out, xp, xz)
      out[r] = row r . x for one token, or for B tokens (kernels_decode.py)
  prefill(w, row_bytes, n_rows, K, T, x, xs, xf, out, ldo)
      out[t, r] for T tokens: a driver shared by the formats of its kind runs token tiles over the
      panel the format's unpack fills (kernels_prefill.py)
  dequant(row, K, out)
      one row decoded to f32 exactly (kernels_decode.py)

Modules: a format's decode, unpack and dequant (format_module); its B-wide decode kernels, compiled
at an engine's first step of several sequences (wide_module); a prefill driver (driver_module); a
block format's AMX panel unpack (amx_module).

Where the CPU has AMX, block-format prefill of amx.AMX_MIN_TOKENS tokens or more runs on its tiles
instead (amx.py: one driver, and per format a panel unpack built on the same block emitters).

Integer ranges: |w| <= 4096 (q6_k with its scale folded in) and |xq| <= 32639, so a pair sum is
below 2^28 and a 32-element block sum below 2^31; the planes kernels' unit sums (q <= 255, 4
elements a lane) stay below 2^25; the words kernels' group sums stay below 2^24, so converting them
is exact (q8_0's, up to 2^27, round once there), q6_k's 16-element sums of q <= 63 below 2^25
before its zero point comes off; q4_k's block sums on the K-quant layout (16 elements a lane, 16 * q
<= 240) stay below 2^28 and round once when converted, q2_k's (4^k * q <= 192) below 2^27.
"""

from __future__ import annotations

from functools import lru_cache

from llvmlite import ir

from . import amx
from . import kernels_prefill_bf16 as bf16
from . import kernels_prefill_q8_ksum as ksum
from . import unpack as U
from .kernels_decode import DECODE_WIDTHS, build_decode, build_decode_q8, build_dequant, wide_widths
from .kernels_prefill import build_driver, build_unpack
from .kernels_prefill_q8 import build_driver_q8, build_unpack_q8, driver_of
from .llvm import Isa, compile_module, is_cached

KINDS = ("decode", "unpack", "dequant")


def format_module(code: int, isa: Isa) -> tuple[ir.Module, list[str]]:
    """The IR module of one format's kernels for one ISA (decode, panel unpack, exact dequant)."""
    from ...formats import BY_CODE

    fmt = BY_CODE[code].name
    mod = ir.Module(name=f"fuel_{fmt}_{isa.name}")
    names = [f"fuel_{k}_{fmt}_{isa.name}" for k in KINDS]
    build_decode(isa, mod, code, names[0])
    build_unpack(isa, mod, code, names[1])
    build_dequant(isa, mod, code, names[2])
    return mod, names


def wide_module(code: int, isa: Isa, widths=None) -> tuple[ir.Module, list[str]]:
    """One format's B-wide decode task kernels, one per width of DECODE_WIDTHS: a module of its own,
    compiled only for engines that carry several sequences."""
    from ...formats import BY_CODE

    fmt = BY_CODE[code].name
    mod = ir.Module(name=f"fuel_wide_{fmt}_{isa.name}")
    names = []
    for B in widths or wide_widths(code):
        names.append(f"fuel_decode{B}_{fmt}_{isa.name}")
        build_decode(isa, mod, code, names[-1], B)
    return mod, names


def q8_module(code: int, isa: Isa, widths=(1,)) -> tuple[ir.Module, list[str]]:
    """One block format's planes decode kernels for 8-bit activations (quantize_q8.py), one per
    width: the one-token kernel, or the B-wide ones (kernels_decode.q8_decode_takes: which ISAs)."""
    from ...formats import BY_CODE

    fmt = BY_CODE[code].name
    mod = ir.Module(name=f"fuel_q8_{fmt}_{isa.name}_{len(widths)}")
    names = []
    for B in widths:
        names.append(f"fuel_decode{'' if B == 1 else B}_q8_{fmt}_{isa.name}")
        build_decode_q8(isa, mod, code, names[-1], B)
    return mod, names


def q8_prefill_module(key, isa: Isa) -> tuple[ir.Module, list[str]]:
    """The q8 prefill tiles (kernels_prefill_q8.py): key a driver (kernels_prefill_q8.driver_of), or
    a format's code for its panel unpack."""
    from ...formats import BY_CODE

    tag = key if isinstance(key, str) else BY_CODE[key].name
    name = f"fuel_prefill_q8_{tag}_{isa.name}"
    mod = ir.Module(name=name)
    if isinstance(key, str):
        return mod, build_driver_q8(isa, mod, key, name)
    build_unpack_q8(isa, mod, key, name)
    return mod, [name]


def q8_ksum_module(key, isa: Isa) -> tuple[ir.Module, list[str]]:
    """The K- and i-quants' q8 prefill tiles on q8_k activations (kernels_prefill_q8_ksum.py): key a driver
    (its kind_of), or a format's code for its panel unpack."""
    from ...formats import BY_CODE

    tag = key if isinstance(key, str) else BY_CODE[key].name
    name = f"fuel_prefill_q8ksum_{tag}_{isa.name}"
    mod = ir.Module(name=name)
    if isinstance(key, str):
        return mod, ksum.build_driver(isa, mod, key, name)
    ksum.build_unpack(isa, mod, key, name)
    return mod, [name]


def q8_bf16_module(key, isa: Isa) -> tuple[ir.Module, list[str]]:
    """BF16 weights' q8 prefill tiles and panel unpack (kernels_prefill_bf16.py); key "bf16"."""
    name = f"fuel_prefill_q8_{key}_{isa.name}"
    mod = ir.Module(name=name)
    return mod, bf16.build(isa, mod, name)


def amx_module(code: int, isa: Isa) -> tuple[ir.Module, list[str]]:
    """One format's AMX panel unpack (amx.py)."""
    from ...formats import BY_CODE

    name = f"fuel_unpack_amx_{BY_CODE[code].name}_{isa.name}"
    mod = ir.Module(name=name)
    amx.unpack_task(mod, code, name)
    return mod, [name]


def driver_module(kind: str, isa: Isa) -> tuple[ir.Module, list[str]]:
    """A prefill driver and its micro-kernels: shared by every format of its kind (the AMX driver
    module also holds the activation split)."""
    name = f"fuel_prefill_{kind}_{isa.name}"
    mod = ir.Module(name=name)
    return mod, build_driver(isa, mod, kind, name)


def driver_kind(code: int) -> str:
    return U.record(code).driver_kind


def _module_name(which: str, key) -> str:
    return f"{which}-{key}"


_BUILDERS = {"format": format_module, "driver": driver_module, "amx": amx_module, "wide": wide_module,
             "q8": q8_module, "q8wide": lambda code, isa: q8_module(code, isa, wide_widths(code)),
             "q8prefill": q8_prefill_module, "q8ksum": q8_ksum_module, "q8bf16": q8_bf16_module}


@lru_cache(maxsize=None)
def _compiled(which: str, key, isa: Isa) -> tuple:
    got = compile_module(_module_name(which, key), lambda: _BUILDERS[which](key, isa), isa)
    return tuple(got.values())


def addresses(code: int, isa: Isa) -> tuple[int, int, int, int]:
    """(decode, prefill driver, unpack, dequant) addresses for one format, compiled or loaded once."""
    decode, unpack, dequant = _compiled("format", code, isa)
    (prefill,) = _compiled("driver", driver_kind(code), isa)
    return decode, prefill, unpack, dequant


def wide_addresses(code: int, isa: Isa) -> tuple:
    """A format's B-wide decode task kernels by DECODE_WIDTHS (0 for a width it has none of)."""
    got = dict(zip(wide_widths(code), _compiled("wide", code, isa)))
    return tuple(got.get(B, 0) for B in DECODE_WIDTHS)


def q8_addresses(code: int, isa: Isa) -> int:
    """A block format's one-token planes decode kernel for 8-bit activations (q8_module)."""
    return _compiled("q8", code, isa)[0]


def q8_wide_addresses(code: int, isa: Isa) -> tuple:
    """Its B-wide ones by DECODE_WIDTHS (0 for a width it has none of)."""
    got = dict(zip(wide_widths(code), _compiled("q8wide", code, isa)))
    return tuple(got.get(B, 0) for B in DECODE_WIDTHS)


def q8_prefill_addresses(code: int, isa: Isa, super_blocks: bool = False) -> tuple[int, int]:
    """(q8 prefill driver, the format's q8 panel unpack): kernels_prefill_q8.py, or with
    super_blocks (q8_k activations) kernels_prefill_q8_ksum.py where it takes the format."""
    if super_blocks and ksum.takes(isa, code):
        (driver,) = _compiled("q8ksum", ksum.kind_of(code), isa)
        (unpack,) = _compiled("q8ksum", code, isa)
        return driver, unpack
    (driver,) = _compiled("q8prefill", driver_of(code, isa), isa)
    (unpack,) = _compiled("q8prefill", code, isa)
    return driver, unpack


def q8_bf16_addresses(isa: Isa) -> tuple[int, int]:
    """(q8 prefill driver, panel unpack) of BF16 weights on vdpbf16ps (kernels_prefill_bf16.py)."""
    return _compiled("q8bf16", "bf16", isa)


def amx_addresses(code: int, isa: Isa) -> tuple[int, int]:
    """(AMX prefill driver, the block format's AMX panel unpack): amx.py."""
    assert amx.permitted(), "AMX kernels without the OS's permission"
    (unpack,) = _compiled("amx", code, isa)
    return _compiled("driver", "amx", isa)[0], unpack


def amx_split(isa: Isa) -> int:
    """The address of the AMX activation split (amx.split_task)."""
    assert amx.permitted(), "AMX kernels without the OS's permission"
    return _compiled("driver", "amx", isa)[1]


def cached(codes, isa: Isa, use_amx: bool = False) -> bool:
    """Whether every kernel module the formats in `codes` need is in the on-disk cache."""
    names = [_module_name("format", c) for c in codes]
    names += [_module_name("driver", k) for k in {driver_kind(c) for c in codes}]
    on_amx = {c for c in codes if use_amx and is_quant(c)}
    names += [_module_name("amx", c) for c in on_amx] + [_module_name("driver", "amx")] * bool(on_amx)
    return all(is_cached(n, isa) for n in names)


def is_quant(code: int) -> bool:
    return U.record(code).quant
