"""``cuda.jit`` for every gpunn kernel: numba-cuda's on-disk cache on (gpunn.kernel_cache), so that a job loads the
kernels an earlier job on the machine compiled instead of compiling them again.

``@jit`` or ``@jit(launch_bounds=256)`` replaces ``@cuda.jit`` on a kernel (device functions are compiled
into their kernels and keep ``cuda.jit(device=True)``). numba's cache keys an entry on the kernel's bytecode, the
values a factory's closure holds and the signature, not on compile options: the options are appended to the
kernel's name, which names its cache file, so two compilations of one function with different launch bounds or
register limits never share an entry. Under the simulator the device-only options are dropped (it takes none) and
nothing is cached. cache_counts() says how many kernels this process loaded from the cache and how many it compiled.
"""

from __future__ import annotations

from numba import cuda

from gpunn import device, kernel_cache

__all__ = ["cache_counts", "jit", "options_tag"]

DEVICE_ONLY = ("launch_bounds", "max_registers")  # options the simulator's jit does not take
_made: list = []  # the dispatchers made here: their cache hits and misses


def options_tag(options: dict) -> str:
    """The compile options as a name part: {'launch_bounds': (256, 2)} -> 'launch_bounds_256_2'."""
    parts = []
    for key in sorted(options):
        value = options[key]
        values = value if isinstance(value, (tuple, list)) else (value,)
        parts.append("_".join([key, *(str(v) for v in values)]))
    return "__".join(parts)


def jit(fn=None, **options):
    """cuda.jit(fn, **options) with the on-disk cache where it is on; usable as @jit and @jit(**options)."""
    if fn is None:
        return lambda f: jit(f, **options)
    if options:
        fn.__qualname__ = f"{fn.__qualname__}.{options_tag(options)}"
    if device.simulator_enabled():
        kept = {k: v for k, v in options.items() if k not in DEVICE_ONLY}
        return cuda.jit(**kept)(fn) if kept else cuda.jit(fn)
    dispatcher = cuda.jit(fn, cache=kernel_cache.configure() is not None, **options)
    _made.append(dispatcher)
    return dispatcher


def cache_counts() -> dict:
    """{'loaded': compilations this process took from the on-disk cache, 'compiled': the ones it compiled}: one per
    kernel and signature launched so far (0 and 0 under the simulator)."""
    loaded = compiled = 0
    for dispatcher in _made:
        stats = dispatcher.stats
        loaded += sum(stats.cache_hits.values())
        compiled += sum(stats.cache_misses.values())
    return {"loaded": loaded, "compiled": compiled}
