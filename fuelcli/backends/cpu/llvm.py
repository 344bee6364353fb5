"""The hot kernels as LLVM IR, compiled by llvmlite for one instruction set, cached as object code.

numba compiles the orchestration (forward.py) once, whatever the model; the kernels that depend on
a weight format (kernels.py) are generated here only for the formats a model uses, so a first run
compiles a few small modules instead of every format's code inlined into numba functions. numba
calls them through their addresses (`kcall`), so its own cache holds no address.

Instruction sets, best first (detected once; FUEL_ISA=name forces one the host can run):
    avx512vnni  16 lanes, vpdpwssd on zmm (int16 x int16 -> int32, accumulating)
    avxvnni     8 lanes, vpdpwssd on ymm (VEX encoded: Alder Lake and later without AVX-512)
    avx2        8 lanes, vpmaddwd + vpaddd
    generic     8 lanes, portable IR (sext, mul, pairwise add): any LLVM target

Compiled objects are cached under NUMBA_CACHE_DIR (else FUEL_HOME) in fuel-kernels/, keyed by the
module's name, a digest of the sources that generate the IR (backends/cpu and formats: jit.py's
SOURCE_DIGEST), the CPU and its features and the llvmlite/LLVM versions: a kernel change or another
machine never reuses a stale object, and a warm start neither builds nor prints any IR (that took
~0.4 s per start for a K-quant model). Each object has its function names beside it (.names);
writes are atomic (a temporary file renamed), names first.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import NamedTuple

import llvmlite
import llvmlite.binding as llb
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...errors import InputError
from ...fileio.derived_cache import cache_root, write_atomic
from .jit import SOURCE_DIGEST


class Isa(NamedTuple):
    name: str
    lanes: int  # i32 / f32 lanes of one vector register
    cpu: str  # LLVM cpu name when not the host's (tests run every ISA on one machine)
    features: str  # LLVM feature string when not the host's
    emulated: bool = False  # its dot instructions as portable IR, for the host (emulated(): tests)


ISAS = {
    "avx512vnni": Isa("avx512vnni", 16, "icelake-server", ""),
    "avxvnni": Isa("avxvnni", 8, "alderlake", ""),
    "avx2": Isa("avx2", 8, "haswell", ""),
    "generic": Isa("generic", 8, "", ""),
}
# what each ISA needs from the host
_NEEDS = {
    "avx512vnni": ("avx512f", "avx512bw", "avx512vl", "avx512vnni", "fma", "f16c"),
    "avxvnni": ("avx2", "avxvnni", "fma", "f16c"),
    "avx2": ("avx2", "fma", "f16c"),
    "generic": (),
}

_lock = threading.Lock()
_init = False


def _llvm():
    global _init
    if not _init:
        llb.initialize_native_target()
        llb.initialize_native_asmprinter()
        llb.initialize_native_asmparser()  # the AVX2 micro-kernel is inline assembly
        # LLVM turns zeroing and copying loops into calls to these: an object file refers to them
        # by name, and the loader resolves them only from symbols it was told about (unresolved,
        # a call would jump to address 0)
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        for name in ("memset", "memcpy", "memmove"):
            llb.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)
        _init = True


def host_features() -> dict:
    _llvm()
    return {k: v for k, v in llb.get_host_cpu_features().items()}


def supported(name: str, feats: dict | None = None) -> bool:
    feats = host_features() if feats is None else feats
    is_x86 = llb.get_process_triple().startswith(("x86_64", "i686", "i386"))
    return name == "generic" or (is_x86 and all(feats.get(f, False) for f in _NEEDS[name]))


def host_isa() -> Isa:
    """The best ISA this machine runs, or FUEL_ISA's choice (an error if the host cannot run it)."""
    forced = os.environ.get("FUEL_ISA", "").strip().lower()
    if forced:
        if forced not in ISAS:
            raise InputError(f"FUEL_ISA={forced!r}: choose one of {', '.join(ISAS)}")
        if not supported(forced):
            raise InputError(f"FUEL_ISA={forced}: this CPU lacks {', '.join(_NEEDS[forced])}")
        return ISAS[forced]
    return next(ISAS[n] for n in ISAS if supported(n))


def emulated(name: str) -> Isa:
    """ISA `name`'s kernels (its vector width, its kernels' choice: avx512vnni's planes decode) with
    its integer dots written as portable IR and compiled for this host: the tests run that logic on
    a CPU without the instructions (its results, not its speed)."""
    return ISAS[name]._replace(emulated=True)


def planes_isa(isa: Isa) -> bool:
    """Whether the ISA's block-format decode kernels read one token's int16 activations as two int8
    planes (vpdpbusd: kernels_decode._decode_planes); the others read them as int16 words (_decode_words)."""
    return isa.name == "avx512vnni"


def _target_machine(isa: Isa):
    _llvm()
    best = next(n for n in ISAS if supported(n))
    if isa.emulated or isa.name == best or (isa.name == "generic" and not isa.cpu):
        cpu, feats = llb.get_host_cpu_name(), llb.get_host_cpu_features().flatten()
    else:
        cpu, feats = isa.cpu, isa.features
    if isa.name == "avx512vnni":
        feats = ",".join(f for f in (feats, "-prefer-256-bit") if f)  # full-width zmm code
    if isa.name in ("avx512vnni", "avxvnni"):  # LLVM splits vpdpwssd into vpmaddwd + vpaddd otherwise
        feats = ",".join(f for f in (feats, "+fast-dpwssd") if f)
    target = llb.Target.from_triple(llb.get_process_triple())
    tm = target.create_target_machine(cpu=cpu, features=feats, opt=3, reloc="static", codemodel="jitdefault")
    return tm, f"{cpu}|{feats}"


def cache_dir() -> Path:
    return cache_root() / "fuel-kernels"


_engines = []  # the execution engines whose code is in use: they live as long as the process


def _object_path(name: str, isa: Isa, perf_map: bool = False):
    tm, target = _target_machine(isa)
    key = hashlib.sha256("\n".join([name, SOURCE_DIGEST, llvmlite.__version__, str(llb.llvm_version_info),
                                    tm.triple, target, llb.get_host_cpu_name(),
                                    llb.get_host_cpu_features().flatten(), "perf-map" if perf_map else "",
                                    "emulated" if isa.emulated else ""])
                         .encode()).hexdigest()[:32]
    return tm, cache_dir() / f"{isa.name}-{name}-{key}.o"


def is_cached(name: str, isa: Isa) -> bool:
    return _object_path(name, isa)[1].is_file()


def compile_module(name: str, build, isa: Isa) -> dict[str, int]:
    """The addresses of the functions of module `name` for `isa`: loaded from the cache, else
    build() -> (ir.Module, [function names]) is compiled and cached.

    FUEL_PERF_MAP=1 (profiling): every function of the module is made visible and listed in
    /tmp/perf-PID.map, so `perf report` names the kernels."""
    perf_map = bool(os.environ.get("FUEL_PERF_MAP"))
    tm, path = _object_path(name, isa, perf_map)
    names_path = path.with_suffix(".names")
    with _lock:
        obj = None
        if not perf_map:  # profiling rebuilds: the map needs every function's name
            try:  # the names are written before the object: an object found has its names
                obj = path.read_bytes()
                names = json.loads(names_path.read_text())
            except (OSError, ValueError):
                obj = None
        visible = []
        if obj is None:
            module, names = build()
            if perf_map:
                for fn in module.functions:
                    if not fn.is_declaration:
                        fn.linkage = ""
                visible = [fn.name for fn in module.functions if not fn.is_declaration]
            mod = llb.parse_assembly(str(module))
            mod.triple = tm.triple
            mod.data_layout = str(tm.target_data)
            mod.verify()
            pto = llb.create_pipeline_tuning_options(speed_level=3)
            pb = llb.create_pass_builder(tm, pto)
            pb.getModulePassManager().run(mod, pb)
            obj = tm.emit_object(mod)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(names_path, json.dumps(names).encode())
                write_atomic(path, obj)
            except OSError:  # a read-only cache is not an error: the code still runs
                pass
        _llvm()
        ee = llb.create_mcjit_compiler(llb.parse_assembly(""), tm)
        ee.add_object_file(llb.ObjectFileRef.from_data(obj))
        ee.finalize_object()
        _engines.append(ee)
        if visible:  # sizes: up to the next function (the last one: 64 KiB at most)
            starts = sorted(((n, ee.get_function_address(n)) for n in visible), key=lambda kv: kv[1])
            with open(f"/tmp/perf-{os.getpid()}.map", "a") as f:
                for (fname, a), nxt in zip(starts, starts[1:] + [("", starts[-1][1] + 65536)]):
                    f.write(f"{a:x} {nxt[1] - a:x} {fname}\n")
        return {n: ee.get_function_address(n) for n in names}


def assembly(module: ir.Module, isa: Isa) -> str:
    """The machine code of a module as text (to check which instructions a kernel uses)."""
    tm, _ = _target_machine(isa)
    mod = llb.parse_assembly(str(module))
    mod.triple = tm.triple
    pto = llb.create_pipeline_tuning_options(speed_level=3)
    pb = llb.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_assembly(mod)


# ------------------------------------------------------------------ numba calls a kernel by address


@intrinsic
def kcall(typingctx, fp, args):
    """kcall(address, (a0, a1, ...)): call the void kernel at `address` with int64 arguments."""
    if not isinstance(args, types.UniTuple) or args.dtype != types.int64:
        return None
    n = args.count
    sig = types.none(types.int64, args)

    def codegen(context, builder, signature, llargs):
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)] * n)
        fn = builder.inttoptr(llargs[0], fnty.as_pointer())
        builder.call(fn, cgutils.unpack_tuple(builder, llargs[1], n))
        return context.get_dummy_value()

    return sig, codegen


# ptr and args11 are intrinsics, not helpers: a helper compiles (and makes machine code of) its
# own library per argument types, and the forward passes ten array types to ptr and eight argument
# counts to args11: 0.6 s of a first run's compile

@intrinsic
def ptr(typingctx, a):
    """The address of an array's data, as an int64."""
    if not isinstance(a, types.Array):
        return None

    def codegen(context, builder, signature, llargs):
        data = context.make_array(a)(context, builder, llargs[0]).data
        return builder.ptrtoint(data, ir.IntType(64))

    return types.int64(a), codegen


@intrinsic
def args11(typingctx, *args):
    """args11(a0, a1, ...) with at most 11 integers: the kernels' 11 int64 arguments, zeros after the
    last one given."""
    if len(args) > 11 or not all(isinstance(t, (types.Integer, types.Boolean)) for t in args):
        return None
    out = types.UniTuple(types.int64, 11)

    def codegen(context, builder, signature, llargs):
        given = cgutils.unpack_tuple(builder, llargs[0], len(args))
        cast = [context.cast(builder, v, t, types.int64) for v, t in zip(given, args)]
        return context.make_tuple(builder, out, cast + [ir.Constant(ir.IntType(64), 0)] * (11 - len(args)))

    return out(types.StarArgTuple.from_types(args)), codegen


@intrinsic
def stack_counter(typingctx):
    """The address of a zeroed int64 in the calling function's frame (it lives as long as the call)."""

    def codegen(context, builder, signature, llargs):
        slot = cgutils.alloca_once(builder, ir.IntType(64))
        builder.store(ir.Constant(ir.IntType(64), 0), slot)
        return builder.ptrtoint(slot, ir.IntType(64))

    return types.int64(), codegen


@intrinsic
def stack_counters(typingctx, count):
    """The address of `count` zeroed int64 counters in the calling function's frame, 64 bytes
    apart (a cache line each: threads that take from their own counter do not share its line)."""
    if not isinstance(count, types.Integer):
        return None

    def codegen(context, builder, signature, llargs):
        n = builder.mul(context.cast(builder, llargs[0], count, types.int64), ir.Constant(ir.IntType(64), 8))
        slots = builder.alloca(ir.IntType(64), size=n)
        slots.align = 64
        cgutils.memset(builder, slots, builder.mul(n, ir.Constant(ir.IntType(64), 8)), 0)
        return builder.ptrtoint(slots, ir.IntType(64))

    return types.int64(count), codegen


@intrinsic
def take(typingctx, address, step):
    """take(address, step): a parallel loop's next task, the int64 at `address` shared by its
    threads: returns it and moves it on by `step`, atomically."""
    if not isinstance(address, types.Integer) or not isinstance(step, types.Integer):
        return None

    def codegen(context, builder, signature, llargs):
        counter = builder.inttoptr(llargs[0], ir.IntType(64).as_pointer())
        return builder.atomic_rmw("add", counter, context.cast(builder, llargs[1], step, types.int64), "monotonic")

    return types.int64(address, step), codegen


@intrinsic
def thread_count(typingctx):
    """numba's thread count for the calling thread (numba.set_num_threads), from the threading
    layer's get_num_threads symbol, which numba's own parallel loops call: numba.get_num_threads()
    in a jitted function calls it through a ctypes pointer, which keeps the function out of the
    on-disk cache."""

    def codegen(context, builder, signature, llargs):
        # declared as numba's parallel loops declare it (one declaration per module); the C
        # function returns an int: its 32 bits, sign-extended
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(cgutils.intp_t, []), "get_num_threads")
        return builder.sext(builder.trunc(builder.call(fn, []), ir.IntType(32)), ir.IntType(64))

    return types.int64(), codegen
