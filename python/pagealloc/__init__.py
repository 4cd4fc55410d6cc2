"""pagealloc: KV-cache slots from a pagealloc daemon, for Python schedulers.

    import pagealloc
    with pagealloc.Client.connect("unix:///run/pagealloc/gpu0.sock",
                                  name="scheduler-tp0") as client:
        a = client.alloc_extend(prefix_lens, seq_lens, last_locs).check()
        slots = a.slots      # NumPy (CPU backend) or CudaSlots (CUDA), no copy
        ...
        client.release(a)    # the ring space may be reused from now on
        k0 = client.kv_buffer("k.0").as_torch()   # the daemon's KV, no copy

The package binds libpagealloc_client.so (client/pagealloc.h) with ctypes;
docs/python.md is the guide.
"""

from pagealloc import _native
from pagealloc.client import (Allocation, Client, CudaSlots, FreeGroup,
                              FreeLists, KvBuffer, PageReserve, PoolInfo,
                              RequestResult, RingInfo, Stats, clear_pool,
                              get_free_lists, reset_prefix_cache)
from pagealloc.errors import (AbortedError, AlreadyExistsError,
                              CancelledError, DataLossError,
                              DeadlineExceededError, FailedPreconditionError,
                              InternalError, InvalidArgumentError,
                              NotFoundError, OutOfRangeError, PageallocError,
                              PermissionDeniedError, ResourceExhaustedError,
                              StatusCode, UnauthenticatedError,
                              UnavailableError, UnimplementedError,
                              UnknownError, error_for)

__version__ = _native.lib.pagealloc_version().decode()
# pagealloc_abi_version(): major << 16 | minor (65543 for 1.7), and the
# same as "major.minor", as the docs write it.
ABI_VERSION = _native.lib.pagealloc_abi_version()
ABI_VERSION_TEXT = "%d.%d" % (ABI_VERSION >> 16, ABI_VERSION & 0xFFFF)
LIBRARY_PATH = _native.path

__all__ = [
    "ABI_VERSION", "ABI_VERSION_TEXT", "LIBRARY_PATH", "Allocation", "Client", "CudaSlots",
    "FreeGroup", "FreeLists", "KvBuffer", "PoolInfo", "RequestResult",
    "RingInfo", "Stats", "clear_pool", "get_free_lists", "reset_prefix_cache",
    "AbortedError", "AlreadyExistsError", "CancelledError", "DataLossError",
    "DeadlineExceededError", "FailedPreconditionError", "InternalError",
    "InvalidArgumentError", "NotFoundError", "OutOfRangeError",
    "PageallocError", "PermissionDeniedError", "ResourceExhaustedError",
    "StatusCode", "UnauthenticatedError", "UnavailableError",
    "UnimplementedError", "UnknownError", "error_for",
]
