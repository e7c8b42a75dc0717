"""A prompt's KV buffer in transparent huge pages, where Linux offers them on request.

A 4,000-token prompt's KV buffer is ~94 MB, allocated fresh for each prompt and paged in
4 KiB at a time: ~23,000 page faults, 21-29 ms of a next turn's ~200 ms before a single token
is computed. In 2 MiB pages the same buffer filled with its cached prefix took 17-21 ms
instead of 36-38 (2-core Intel Xeon, scratch script). Only this buffer is advised: asking it
for every large tensor (torch's THP_MEM_ALLOC_ENABLE, tried and reverted) made each prefill
step's temporaries fault in whole 2 MiB pages, and a pasted prompt's steps slower.
"""

from __future__ import annotations

import ctypes
import functools
import sys

import torch

MADV_HUGEPAGE = 14
PAGE = 4096


def advise(tensor: torch.Tensor) -> bool:
    """Asks for huge pages under `tensor`'s memory (a CPU tensor not yet written, so that its
    pages are not in yet); whether the kernel took the advice. Its contents are unchanged."""
    if tensor.device.type != "cpu" or not sys.platform.startswith("linux"):
        return False
    start = -(-tensor.data_ptr() // PAGE) * PAGE
    end = (tensor.data_ptr() + tensor.numel() * tensor.element_size()) // PAGE * PAGE
    if end - start < 512 * PAGE:  # under one huge page: nothing to gain
        return False
    return _madvise()(start, end - start, MADV_HUGEPAGE) == 0


@functools.cache
def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise
