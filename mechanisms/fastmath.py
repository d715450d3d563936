"""exp and log that LLVM can vectorise inside numba loops (numba calls the C library's scalar exp
and log, ~6 ns each; these run 8 lanes at a time on AVX-512, ~1 ns, within 2 ulps).

exp: Cody & Waite 1980 range reduction x = k ln 2 + r, 0 <= r < ln 2, then the degree-17 Taylor
polynomial (truncation < 3e-19 relative) and the scale 2^k built in the exponent bits.
log: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(f), f = (m - 1)/(m + 1), |f| < 0.172,
by its odd series to f^23 (truncation < 1e-19). Special values follow IEEE: exp(-inf) = 0,
exp(+inf) = inf, log(0) = -inf, log(inf) = inf, NaN in gives NaN out. exp returns 0 below
-708.39 (where the C library gives a subnormal): every caller sums terms shifted so that the
largest is 1, so a term below 2.2e-308 changes no sum by more than the rounding already allowed.

Compiled kernels are cached on disk (numba's cache, `configure_kernel_cache`): a process that finds
them there, a Dask worker included, starts in about a second instead of compiling for 10-60 s.
numba keys its cache on the CPU name and features (which carry the vector width
`prefer_wide_vectors` chose) and on the source file's hash; the directory's name adds a hash of
every module whose code or constants the kernels compile in, since numba does not notice a change
in another module's function that a kernel inlines. Cached and fresh code give the same bits
(dpledger.mechanisms.fused says what that takes).
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable, Literal, TypedDict, TypeVar, Unpack, cast


_VECTORS_DECIDED = False
"""Whether prefer_wide_vectors has run in this process (its decision is made once)."""


def prefer_wide_vectors() -> None:
    """Let LLVM use 512-bit vectors on CPUs with AVX-512 (Intel's models prefer 256 there by default):
    the fused kernels are arithmetic-bound and run 1.4x faster. Set before numba builds its CPU
    target: skipped when NUMBA_CPU_FEATURES is already set, with DPLEDGER_VECTOR_BITS=256, or when
    a numba function imported before dpledger already compiled (numba's target machine then exists).
    The vector width changes the last bits of the kernels' sums (they are reassociated into vector
    lanes), so it is part of numba's cache key (the CPU features) and, where it differs between two
    processes, of the rounding the audit allows (dpledger.audit.replay). Runs when this module is
    imported; calling it again is a no-op."""
    global _VECTORS_DECIDED
    if _VECTORS_DECIDED:
        return
    _VECTORS_DECIDED = True
    if os.environ.get("DPLEDGER_VECTOR_BITS") == "256" or "NUMBA_CPU_FEATURES" in os.environ:
        return
    if "numba" in sys.modules:
        from numba.core.registry import cpu_target

        if "_toplevel_target_context" in vars(cpu_target):   # its target machine is built: too late
            return
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" in features.split(","):
        os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"
        os.environ["NUMBA_CPU_NAME"] = llvm.get_host_cpu_name()
        _reload_numba_config()


def _reload_numba_config() -> None:
    """Where numba was imported before dpledger, re-read its NUMBA_* settings now, as its compiler does
    before each compilation (numba.core.config.reload_config)."""
    if "numba" in sys.modules:
        from numba.core.config import reload_config

        reload_config()  # type: ignore[no-untyped-call]  # numba.core.config has no annotations


_KERNEL_SOURCES = ("mechanisms/fastmath.py", "mechanisms/fused.py", "mechanisms/add_one.py", "accounting/rounding.py")
"""The files (relative to the package root) whose code or module constants the cached kernels compile in."""


def kernel_cache_dir() -> str | None:
    """Where numba caches dpledger's compiled kernels: $DPLEDGER_NUMBA_CACHE ("off": no on-disk cache;
    default the user cache directory, $XDG_CACHE_HOME or ~/.cache, under dpledger/numba), in a
    subdirectory named by the numba version and a hash of _KERNEL_SOURCES, so that an edit to any
    of them starts a fresh cache. A NUMBA_CACHE_DIR the user set is used as it is.

    Returns:
        The directory (not created here), or None when caching is off.
    """
    if "NUMBA_CACHE_DIR" in os.environ:
        return os.environ["NUMBA_CACHE_DIR"]
    chosen = os.environ.get("DPLEDGER_NUMBA_CACHE", "")
    if chosen.lower() == "off":
        return None
    base = Path(chosen) if chosen else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpledger" / "numba"
    return str(base / _cache_subdirectory())


@functools.lru_cache(maxsize=1)
def _cache_subdirectory() -> str:
    """numba-<version>-<hash of _KERNEL_SOURCES>."""
    numba_version = version("numba")
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(numba_version.encode())
    for name in _KERNEL_SOURCES:
        digest.update((root / name).read_bytes())
    return f"numba-{numba_version}-{digest.hexdigest()[:16]}"


def configure_kernel_cache() -> None:
    """Point numba's on-disk cache at kernel_cache_dir() (NUMBA_CACHE_DIR, which Dask workers started
    from this process inherit, so they share it). Where that directory cannot be written, numba
    falls back to __pycache__ beside the source, then to the user cache directory; where none of
    them can (a read-only site-packages and home), `jit` compiles without caching. Runs when this
    module is imported; calling it again is a no-op."""
    directory = kernel_cache_dir()
    if directory is None or os.environ.get("NUMBA_CACHE_DIR") == directory:
        return
    os.environ["NUMBA_CACHE_DIR"] = directory
    _reload_numba_config()


prefer_wide_vectors()
configure_kernel_cache()

import numpy as np  # noqa: E402 (numba reads the CPU features when it is imported)
from llvmlite import ir  # noqa: E402
from numba import njit, types  # noqa: E402
from numba.core import caching, cgutils  # noqa: E402


def serialise_cache_saves() -> None:
    """Make numba's cache saves safe between processes. numba keeps one index file per function, mapping
    each compiled signature to a data file, and its IndexDataCacheFile.save reads the index, picks the
    first free data file name, rewrites the index and then writes the data, with no lock. Two processes
    saving two signatures of one function at the same moment (pytest or Dask workers, the demo and its
    background warm-up, a kernel and the callee it compiles) can then both pick one name, and the index
    can end up naming one signature's code for the other: a later process loads it and runs the wrong
    code, and keeps loading it. This wraps save in an exclusive lock per index (fcntl.flock on
    <index>.lock), reads the index inside it, and writes the data before the index that names it, so an
    index never names a file that is not yet, or no longer, its signature's. A new signature takes a data
    file name that no file has yet: where the index is stale (its source stamp differs, as after a touch
    that keeps the source's content), numba's own save reuses the first name, whose file a reader holding
    the older index may still be about to load as another signature's; the older files are left in place.
    Where fcntl or numba's internals are missing, or the lock file cannot be opened or locked (ENOLCK on
    some network file systems), numba's own save runs. Runs when this module is imported; calling it again
    is a no-op."""
    cache_file = getattr(caching, "IndexDataCacheFile", None)
    needed = ("save", "_load_index", "_save_index", "_save_data", "_data_name", "_data_path")
    if cache_file is None or not all(hasattr(cache_file, name) for name in needed) \
            or getattr(cache_file.save, "serialised", False):
        return
    try:
        import fcntl  # deferred: POSIX only
    except ImportError:
        return
    unlocked = cache_file.save

    def save(self: Any, key: object, data: object) -> None:   # (numba's class is untyped)
        try:
            lock = open(self._index_path + ".lock", "ab")
        except OSError:
            unlocked(self, key, data)
            return
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
            except OSError:
                unlocked(self, key, data)
                return
            overloads = self._load_index()
            name = overloads.get(key)
            if name is None:
                taken = set(overloads.values())
                number = 1
                while self._data_name(number) in taken or os.path.exists(self._data_path(self._data_name(number))):
                    number += 1
                name = self._data_name(number)
            self._save_data(name, data)
            overloads[key] = name
            self._save_index(overloads)

    save.serialised = True  # type: ignore[attr-defined]
    cache_file.save = save


serialise_cache_saves()
from numba.core.base import BaseContext  # noqa: E402
from numba.core.typing import Signature  # noqa: E402
from numba.core.typing.context import Context  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

F = TypeVar("F", bound=Callable[..., object])
"""A function compiled by `jit`: it keeps its annotated signature."""


class JitOptions(TypedDict, total=False):
    """The options of numba.njit that dpledger's kernels set (numba's documentation defines them)."""

    parallel: bool
    inline: Literal["never", "always"]
    fastmath: bool | set[str]
    error_model: Literal["python", "numpy"]
    cache: bool
    nogil: bool


def jit(**options: Unpack[JitOptions]) -> Callable[[F], F]:
    """numba.njit(function, **options), typed: the compiled function keeps the signature it is annotated with.

    Every fused kernel is compiled through this one decorator, so that mypy checks its callers against
    its annotations (numba's stubs give a Dispatcher, whose calls they do not type). Only the options
    given are passed on: `@jit()` compiles exactly as a bare `@njit` does.

    Args:
        **options: numba.njit's keyword options (JitOptions), passed on unchanged, except that
            cache=True compiles without caching where caching is off or no cache directory is writable.

    Returns:
        A decorator that compiles a function lazily, on its first call, for the argument types of that call.
    """
    def compile_function(function: F) -> F:
        # numba's stubs type njit(function) as Dispatcher[F], which mypy cannot call with F's arguments;
        # at run time the dispatcher takes exactly those arguments (and compiled callers call it natively)
        uncached: JitOptions = {**options, "cache": False}
        if options.get("cache") and "NUMBA_CACHE_DIR" not in os.environ and kernel_cache_dir() is None:
            return cast(F, njit(function, **uncached))
        try:
            return cast(F, njit(function, **options))
        except RuntimeError:   # numba found no writable cache directory: compile in memory only
            return cast(F, njit(function, **uncached))
    return compile_function


_Codegen = Callable[[BaseContext, ir.IRBuilder, Signature, list[ir.Value]], ir.Value]
"""An intrinsic's code generator: (target context, LLVM builder, signature, argument values) -> value."""

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 split so that k * _LN2_HI is exact for |k| < 2^20
_LN2_LO = 1.90821492927058770002e-10
_EXP_UNDERFLOW = -708.3964185322641   # below: exp(x) < smallest normal
_EXP_OVERFLOW = 709.782712893384      # above: exp(x) = inf
_SMALLEST_NORMAL = 2.2250738585072014e-308
MAX_ULPS = 2.0
"""Largest error of vexp and vlog measured against the C library over 10^7 arguments
(tests/test_fused_kernels.py), in units in the last place; callers round up by more."""
PAIR_MAX_ULPS = 2.5
"""Largest error of either value of vexp_pair, measured as MAX_ULPS is (tests/test_fused_kernels.py):
callers' 8-ulp-per-unit rounding allowance (dpledger.mechanisms.kernels) is over 3x this."""


def _bits_as_float_typer(typingctx: Context, bits: types.Type) -> tuple[Signature, _Codegen]:
    def codegen(context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]) -> ir.Value:
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


def _float_as_bits_typer(typingctx: Context, value: types.Type) -> tuple[Signature, _Codegen]:
    def codegen(context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]) -> ir.Value:
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


def _fused_multiply_add_typer(typingctx: Context, a: types.Type, b: types.Type,
                              c: types.Type) -> tuple[Signature, _Codegen]:
    """a * b + c rounded once (llvm.fma): an intrinsic call, so a caller compiled with fastmath
    "reassoc" cannot regroup it (regrouping x - k ln2_hi - k ln2_lo costs 200 ulps)."""
    def codegen(context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]) -> ir.Value:
        return builder.fma(*args)
    return types.float64(types.float64, types.float64, types.float64), codegen


# An intrinsic is called from compiled code only, without the typing context its typer takes first; numba's
# stubs type the Python-level call (which raises). Each is cast to the call compiled code makes.
_bits_as_float = cast(Callable[[int | np.int64], float], intrinsic(_bits_as_float_typer))
_float_as_bits = cast(Callable[[float], int], intrinsic(_float_as_bits_typer))
_fused_multiply_add = cast(Callable[[float, float, float], float], intrinsic(_fused_multiply_add_typer))


def _min_max_intrinsic(name: str, doc: str) -> Callable[[float, float], float]:
    def typer(typingctx: Context, a: types.Type, b: types.Type) -> tuple[Signature, _Codegen]:
        def codegen(context: BaseContext, builder: ir.IRBuilder, signature: Signature,
                    args: list[ir.Value]) -> ir.Value:
            double = ir.DoubleType()
            # numba.core.cgutils has no annotations
            function = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
                builder.module, ir.FunctionType(double, [double, double]), f"llvm.{name}.f64")
            return builder.call(function, args)
        return types.float64(types.float64, types.float64), codegen
    typer.__doc__ = doc
    # called from compiled code only, as (a, b) (see _bits_as_float)
    return cast(Callable[[float, float], float], intrinsic(typer))


vmax = _min_max_intrinsic("maxnum", """llvm.maxnum: a maximum whose reductions vectorise (numba's max() does
not); a NaN argument yields the other one, so callers check for NaN input themselves.""")
vmin = _min_max_intrinsic("minnum", "llvm.minnum: the minimum counterpart of vmax.")


fma = _fused_multiply_add
"""a * b + c with one rounding, never regrouped by a caller's fastmath flags: mixtures
lam * p + (1 - lam) * p0 are formed with it, since "reassoc" would otherwise rewrite them as
p0 + lam (p - p0), which loses every digit of a small p next to a large p0."""


@jit()
def vexp(x: float) -> float:
    """exp(x) in compiled code, vectorisable (the module docstring has the method), within MAX_ULPS ulps.

    Args:
        x: the exponent (any float64).

    Returns:
        exp(x); 0 below -708.39 (no subnormals), +inf above 709.78, NaN for NaN.
    """
    clamped = min(max(x, -709.0), 709.79)
    k = np.floor(clamped * _LOG2E)           # r in [0, ln 2): 2^k stays a normal number for x in range
    r = _fused_multiply_add(-k, _LN2_LO, _fused_multiply_add(-k, _LN2_HI, clamped))
    p = 1.0 + r * (1.0 + r * (0.5 + r * (0.16666666666666666 + r * (0.041666666666666664 + r * (0.008333333333333333 + r * (0.001388888888888889 + r * (0.0001984126984126984 + r * (2.48015873015873e-05 + r * (2.7557319223985893e-06 + r * (2.755731922398589e-07 + r * (2.505210838544172e-08 + r * (2.08767569878681e-09 + r * (1.6059043836821613e-10 + r * (1.1470745597729725e-11 + r * (7.647163731819816e-13 + r * (4.779477332387385e-14 + r * (2.8114572543455206e-15)))))))))))))))))
    value = p * _bits_as_float((np.int64(k) + 1023) << 52)
    value = value if x >= _EXP_UNDERFLOW else 0.0
    value = value if x <= _EXP_OVERFLOW else np.inf
    return value if x == x else x


@jit(inline="always")
def vexp_pair(x: float) -> tuple[float, float]:
    """(exp(x), exp(-x)) in compiled code for about the cost of one vexp, vectorisable, each within
    PAIR_MAX_ULPS ulps: where a sum needs both a power and its reciprocal (the two directions of a
    Renyi divergence), this replaces a second exp or a division (which costs more than the exp on
    AVX2/AVX-512).

    Method: x = k ln 2 + r with k = round(x / ln 2), |r| <= ln 2 / 2 (Cody & Waite 1980, as vexp);
    exp(+-r) = E(r^2) +- r O(r^2), E and O the even and odd halves of the degree-13 Taylor polynomial
    (truncation < 5e-18 relative for |r| <= 0.347), each finished by one fma and scaled by 2^(+-k).

    Args:
        x: the exponent (any float64).

    Returns:
        (exp(x), exp(-x)); each 0 where its exponent is below -708.39 (no subnormals), +inf above
        709.78, NaN for NaN.
    """
    clamped = min(max(x, -709.0), 709.0)
    k = np.floor(_fused_multiply_add(clamped, _LOG2E, 0.5))
    r = _fused_multiply_add(-k, _LN2_LO, _fused_multiply_add(-k, _LN2_HI, clamped))
    s = r * r
    even = 1.0 + s * (0.5 + s * (1.0 / 24 + s * (1.0 / 720 + s * (1.0 / 40320 + s * (1.0 / 3628800 + s * (
        1.0 / 479001600))))))
    odd = 1.0 + s * (1.0 / 6 + s * (1.0 / 120 + s * (1.0 / 5040 + s * (1.0 / 362880 + s * (1.0 / 39916800 + s * (
        1.0 / 6227020800))))))
    whole = np.int64(k)
    up = _fused_multiply_add(r, odd, even) * _bits_as_float((whole + 1023) << 52)
    down = _fused_multiply_add(-r, odd, even) * _bits_as_float((1023 - whole) << 52)
    up = up if x >= _EXP_UNDERFLOW else 0.0
    up = up if x <= _EXP_OVERFLOW else np.inf
    down = down if -x >= _EXP_UNDERFLOW else 0.0
    down = down if -x <= _EXP_OVERFLOW else np.inf
    return (up, down) if x == x else (x, x)


@jit(inline="always")
def vlog(x: float) -> float:
    """log(x) in compiled code, vectorisable (the module docstring has the method), within MAX_ULPS ulps.

    Args:
        x: the argument (any float64; subnormals are scaled by 2^54 first).

    Returns:
        log(x); -inf at 0, +inf at +inf, NaN for a negative or NaN argument.
    """
    subnormal = x < _SMALLEST_NORMAL
    bits = _float_as_bits(x * (18014398509481984.0 if subnormal else 1.0))   # 2^54 lifts a subnormal
    # the biased exponent as a float through the bits of 2^52 + n (a cast from int64 does not vectorise on AVX2)
    e = _bits_as_float(((bits >> 52) & 0x7FF) | 0x4330000000000000) - (4503599627370496.0 + (1077.0 if subnormal else 1023.0))
    m = _bits_as_float((bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000)   # [1, 2)
    high = m > 1.4142135623730951
    m = m * 0.5 if high else m
    e = e + (1.0 if high else 0.0)
    f = (m - 1.0) / (m + 1.0)
    f2 = f * f
    s = f2 * (1.0 / 3 + f2 * (1.0 / 5 + f2 * (1.0 / 7 + f2 * (1.0 / 9 + f2 * (1.0 / 11 + f2 * (1.0 / 13 + f2 * (
        1.0 / 15 + f2 * (1.0 / 17 + f2 * (1.0 / 19 + f2 * (1.0 / 21 + f2 * (1.0 / 23)))))))))))
    value = _fused_multiply_add(e, _LN2_HI, 2.0 * f + _fused_multiply_add(2.0 * f, s, e * _LN2_LO))
    special = -np.inf if x == 0.0 else (x if x == np.inf else np.nan)   # 0, +inf, negative or NaN
    return value if (x > 0.0 and x < np.inf) else special


@jit(inline="always")
def vexpm1(x: float) -> float:
    """exp(x) - 1 without cancellation near 0, within MAX_ULPS: x = k ln 2 + r, |r| <= ln 2 / 2 (as
    vexp_pair), expm1(r) = r + r^2 (1/2 + r/6 + ... + r^12/14!) (truncation < 2e-18 relative), then
    2^k expm1(r) + (2^k - 1) in one fma (for k != 0 the result is at least 0.29 in magnitude, so the
    sum does not cancel). One polynomial: half the cost of evaluating a series and an exp apart.

    Args:
        x: the exponent (any float64).

    Returns:
        exp(x) - 1 (-1 below -745, +inf above 709.78, NaN for NaN).
    """
    clamped = min(max(x, -745.0), 709.0)
    k = np.floor(_fused_multiply_add(clamped, _LOG2E, 0.5))
    r = _fused_multiply_add(-k, _LN2_LO, _fused_multiply_add(-k, _LN2_HI, clamped))
    tail = r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (1.0 / 720 + r * (1.0 / 5040 + r * (
        1.0 / 40320 + r * (1.0 / 362880 + r * (1.0 / 3628800 + r * (1.0 / 39916800 + r * (1.0 / 479001600 + r * (
            1.0 / 6227020800 + r * (1.0 / 87178291200)))))))))))))
    reduced = _fused_multiply_add(r, tail, r)
    scale = _bits_as_float((np.int64(k) + 1023) << 52) if k > -1023.0 else 0.0
    value = reduced if k == 0.0 else _fused_multiply_add(scale, reduced, scale - 1.0)
    value = value if x <= _EXP_OVERFLOW else np.inf
    return value if x == x else x
