"""Process-wide settings of a training process, applied once at its start."""

from __future__ import annotations

import torch


def configure_process(threads: int) -> None:
    """Set torch's intra-op threads to `threads`, and its inter-op threads to 1 where that is still settable.

    glibc's allocator is left at its defaults on purpose: it keeps freed activations for reuse, which costs RSS but
    saves the page faults of fetching that memory again on every step. docs/operations.md shows how to choose memory
    over speed with `MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_`.
    """
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or inter-op work already ran in this process
        pass
