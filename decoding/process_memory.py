"""Keep freed memory in the process while a run is decoded or audited.

glibc hands every freed block above its mmap threshold (128 KiB, rising dynamically to at most 32 MiB)
back to the kernel, and trims the heap's free top above 128 KiB. A paper-scale step or audit check
allocates and frees arrays of (N + 1) x V float64 (101 x 50,257: 40 MB) many times a step, so each
one was page-faulted and zeroed afresh: measured on the audit of a paper-scale AdaPMixED trace, the
float64 softmax of one step's logits took 75-94 ms, 35-47 ms with freed memory kept, and the whole
audit 2.3 -> 1.5 s a step. Only where memory comes from changes, never a value computed.

The cost: the process keeps the memory it has freed (up to its peak use) until it exits.
DPLEDGER_RETAIN_FREED_MEMORY=0 leaves the allocator as it was.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys

RETAINED_BYTES = 1 << 30
"""Blocks up to this size come from the heap and stay there when freed (mallopt M_MMAP_THRESHOLD and
M_TRIM_THRESHOLD); larger ones are mapped and returned as before."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # glibc's malloc.h
_OLDER_GLIBC_CAP = 32 << 20


@functools.cache
def retain_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds to RETAINED_BYTES (the mmap threshold to 32 MiB where an
    older glibc refuses more), once per process (later calls return the first call's answer). Does
    nothing where the C library is not glibc (no `mallopt`), or where DPLEDGER_RETAIN_FREED_MEMORY is "0".

    Returns:
        Whether both thresholds are set in this process.
    """
    if os.environ.get("DPLEDGER_RETAIN_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    trimmed = mallopt(_M_TRIM_THRESHOLD, RETAINED_BYTES) == 1   # 1: taken, 0: refused
    # an older glibc caps the mmap threshold at 32 MiB: then blocks up to that stay in the heap
    mapped = mallopt(_M_MMAP_THRESHOLD, RETAINED_BYTES) == 1 or mallopt(_M_MMAP_THRESHOLD, _OLDER_GLIBC_CAP) == 1
    return trimmed and mapped
