"""ctypes declarations of libpagealloc_client.so (client/pagealloc.h).

The library is found, in this order: the file named by the
PAGEALLOC_LIBRARY environment variable; libpagealloc_client.so beside this
package (where the wheel puts it); the system's library path (an install by
//client:install). One build of the library serves every CPython 3.x: ctypes
needs no compiled extension.
"""

import ctypes
import os

ABI_VERSION_MAJOR = 1  # the pagealloc.h this module mirrors
ABI_VERSION_MINOR = 4  # the least minor version it calls into
ERROR_MESSAGE_BYTES = 1024

_LIBRARY_NAME = "libpagealloc_client.so"


class Error(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_int32),
        ("message", ctypes.c_char * ERROR_MESSAGE_BYTES),
    ]


class ClientOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("target", ctypes.c_char_p),
        ("client_name", ctypes.c_char_p),
        ("ring_capacity_slots", ctypes.c_int64),
        ("quota_pages", ctypes.c_int64),
        ("keepalive_interval_ms", ctypes.c_int64),
        ("call_timeout_ms", ctypes.c_int64),
        ("fast_channel", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("fast_channel_spin_us", ctypes.c_int64),
        ("register_secret", ctypes.c_char_p),
        ("register_secret_length", ctypes.c_size_t),
        ("map_kv_slab", ctypes.c_int32),
        ("reserved1", ctypes.c_int32),
        # ABI 1.7 (left zero for an older library, which knows none of it)
        ("resumable", ctypes.c_int32),
        ("reserved2", ctypes.c_int32),
        ("reconnect_timeout_ms", ctypes.c_int64),
        ("reconnect_initial_backoff_ms", ctypes.c_int64),
        ("reconnect_max_backoff_ms", ctypes.c_int64),
    ]


class CallOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("return_inline", ctypes.c_int32),
        ("async_completion", ctypes.c_int32),
        ("free_pages_first", ctypes.c_void_p),
        ("num_free_pages_first", ctypes.c_size_t),
        ("checkpoint_first", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("all_or_nothing", ctypes.c_int32),
        ("reserved1", ctypes.c_int32),
    ]


class AllocationView(ctypes.Structure):
    _fields_ = [
        ("num_requests", ctypes.c_int64),
        ("codes", ctypes.c_void_p),
        ("slots", ctypes.c_void_p),
        ("counts", ctypes.c_void_p),
        ("new_pages", ctypes.c_void_p),
        ("messages", ctypes.POINTER(ctypes.c_char_p)),
        ("ring_end", ctypes.c_int64),
        ("pages_freed_first", ctypes.c_int64),
        ("batch_requests", ctypes.c_int32),
        ("on_device", ctypes.c_int32),
        ("num_refused", ctypes.c_int64),
        ("all_slots", ctypes.c_void_p),
        ("num_slots", ctypes.c_int64),
        ("completion_value", ctypes.c_uint64),
        # ABI 1.7 (an older library's view is shorter: read it only then)
        ("link_epoch", ctypes.c_uint64),
    ]


class ReserveOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("initial_batch", ctypes.c_int64),
        ("max_pages", ctypes.c_int64),
        ("tick_us", ctypes.c_int64),
        ("idle_ticks", ctypes.c_int64),
        ("starved_wait_us", ctypes.c_int64),
    ]


class ReserveStats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t)] + [
        (name, ctypes.c_int64) for name in (
            "pages", "handed_out", "batch", "refills", "pages_refilled",
            "returns", "pages_returned", "reclaims", "sync_refills", "takes",
            "refills_refused", "refills_backed_off")
    ]


class PoolInfo(ctypes.Structure):
    _fields_ = [
        ("page_size", ctypes.c_int64),
        ("num_pages", ctypes.c_int64),
        ("backend", ctypes.c_int32),
        ("gpu", ctypes.c_int32),
        ("device_uuid", ctypes.c_char * 64),
        ("free_policy", ctypes.c_char * 16),
    ]


class Stats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("pool", PoolInfo),
        ("free_pages", ctypes.c_int64),
        ("parked_pages", ctypes.c_int64),
        ("used_pages", ctypes.c_int64),
        ("slots_allocated_total", ctypes.c_int64),
        ("pages_allocated_total", ctypes.c_int64),
        ("pages_freed_total", ctypes.c_int64),
        ("out_of_pages_total", ctypes.c_int64),
        ("free_list_sorts_total", ctypes.c_int64),
        ("launches_total", ctypes.c_int64),
        ("sessions_active", ctypes.c_int64),
        ("semantics", ctypes.c_char * 16),
        # ABI 1.5
        ("prefix_published_pages", ctypes.c_int64),
        ("prefix_cached_pages", ctypes.c_int64),
        ("prefix_pinned_pages", ctypes.c_int64),
        ("prefix_evictable_pages", ctypes.c_int64),
        ("prefix_lookup_pages_total", ctypes.c_int64),
        ("prefix_hit_pages_total", ctypes.c_int64),
    ]


class FreeLists(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("free_pages", ctypes.c_void_p),
        ("free_capacity", ctypes.c_int64),
        ("parked_pages", ctypes.c_void_p),
        ("parked_capacity", ctypes.c_int64),
        ("num_free", ctypes.c_int64),
        ("num_parked", ctypes.c_int64),
        ("free_count", ctypes.c_int64),
        ("parked_count", ctypes.c_int64),
    ]


class AdminOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("target", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int64),
    ]


class KvBuffer(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("dtype_bytes", ctypes.c_int64),
        ("num_slots", ctypes.c_int64),
        ("stride_bytes", ctypes.c_int64),
        ("data", ctypes.c_void_p),
        ("on_device", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("element_shape", ctypes.POINTER(ctypes.c_int64)),
        ("rank", ctypes.c_int64),
    ]


def library_path():
    """Where the library is taken from (see the module's docstring)."""
    explicit = os.environ.get("PAGEALLOC_LIBRARY")
    if explicit:
        return explicit
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          _LIBRARY_NAME)
    if os.path.exists(beside):
        return beside
    return _LIBRARY_NAME  # the dynamic loader's search path


def _declare(lib):
    c_client = ctypes.c_void_p
    c_alloc = ctypes.c_void_p
    p_error = ctypes.POINTER(Error)
    i32, i64, size = ctypes.c_int32, ctypes.c_int64, ctypes.c_size_t
    ptr = ctypes.c_void_p
    p_i64 = ctypes.POINTER(ctypes.c_int64)
    p_i32 = ctypes.POINTER(ctypes.c_int32)
    p_alloc = ctypes.POINTER(ctypes.c_void_p)
    p_call = ctypes.POINTER(CallOptions)
    signatures = {
        "pagealloc_abi_version": (ctypes.c_uint32, []),
        "pagealloc_version": (ctypes.c_char_p, []),
        "pagealloc_status_code_name": (ctypes.c_char_p, [i32]),
        "pagealloc_client_options_init":
            (None, [ctypes.POINTER(ClientOptions), size]),
        "pagealloc_call_options_init": (None, [p_call, size]),
        "pagealloc_connect": (i32, [ctypes.POINTER(ClientOptions),
                                    ctypes.POINTER(ctypes.c_void_p), p_error]),
        "pagealloc_close": (i32, [c_client, p_error]),
        "pagealloc_client_destroy": (None, [c_client]),
        "pagealloc_session_status": (i32, [c_client, p_error]),
        "pagealloc_session_id": (ctypes.c_uint64, [c_client]),
        "pagealloc_session_token":
            (ctypes.c_void_p, [c_client, ctypes.POINTER(size)]),
        "pagealloc_lease_ms": (i64, [c_client]),
        "pagealloc_uses_fast_channel": (i32, [c_client]),
        "pagealloc_pool": (None, [c_client, ctypes.POINTER(PoolInfo)]),
        "pagealloc_ring": (ptr, [c_client, p_i64, p_i32]),
        "pagealloc_alloc_extend": (i32, [c_client, ptr, size, ptr, size, ptr,
                                         size, p_call, p_alloc, p_error]),
        "pagealloc_alloc_decode": (i32, [c_client, ptr, size, ptr, size,
                                         p_call, p_alloc, p_error]),
        "pagealloc_alloc": (i32, [c_client, ptr, size, p_call, p_alloc,
                                  p_error]),
        "pagealloc_allocation_get_view":
            (ctypes.POINTER(AllocationView), [c_alloc]),
        "pagealloc_allocation_status": (i32, [c_alloc, p_error]),
        "pagealloc_allocation_destroy": (None, [c_alloc]),
        "pagealloc_release": (None, [c_client, c_alloc]),
        "pagealloc_flush_release": (i32, [c_client, p_error]),
        "pagealloc_order_after_completion": (i32, [c_client, ptr, p_error]),
        "pagealloc_copy_to_host": (i32, [c_client, ptr, i64, ptr, p_error]),
        "pagealloc_free_slots": (i32, [c_client, ptr, size, p_i64, p_error]),
        "pagealloc_free_pages": (i32, [c_client, ptr, size, p_i64, p_error]),
        "pagealloc_checkpoint": (i32, [c_client, p_error]),
        "pagealloc_rollback": (i32, [c_client, p_i64, p_error]),
        "pagealloc_get_stats": (i32, [c_client, ctypes.POINTER(Stats),
                                      p_error]),
        # ABI 1.1
        "pagealloc_pool_semantics": (ctypes.c_char_p, [c_client]),
        "pagealloc_order_after": (i32, [c_client, c_alloc, ptr, p_error]),
        "pagealloc_free_slots_in_order":
            (i32, [c_client, ptr, size, i32, p_i64, p_error]),
        "pagealloc_free_pages_in_order":
            (i32, [c_client, ptr, size, i32, p_i64, p_error]),
        "pagealloc_checkpoint_id":
            (i32, [c_client, ctypes.POINTER(ctypes.c_uint64), p_error]),
        "pagealloc_rollback_to":
            (i32, [c_client, ctypes.c_uint64, p_i64, p_error]),
        "pagealloc_clear_session": (i32, [c_client, p_i64, p_error]),
        "pagealloc_free_lists_init":
            (None, [ctypes.POINTER(FreeLists), size]),
        "pagealloc_get_free_lists":
            (i32, [c_client, ctypes.POINTER(FreeLists), p_error]),
        "pagealloc_admin_options_init":
            (None, [ctypes.POINTER(AdminOptions), size]),
        "pagealloc_admin_get_free_lists":
            (i32, [ctypes.POINTER(AdminOptions), ctypes.POINTER(FreeLists),
                   p_error]),
        "pagealloc_admin_clear_pool":
            (i32, [ctypes.POINTER(AdminOptions), i32, p_i64, p_error]),
        "pagealloc_kv_buffer_count": (i64, [c_client]),
        "pagealloc_kv_buffer_get":
            (i32, [c_client, i64, ctypes.POINTER(KvBuffer), p_error]),
        "pagealloc_kv_buffer_find": (i64, [c_client, ctypes.c_char_p]),
        "pagealloc_kv_slab": (ptr, [c_client, p_i64, p_i32]),
        "pagealloc_kv_copy_to_slab": (i32, [c_client, ptr, ptr, i64, p_error]),
        "pagealloc_kv_copy_from_slab":
            (i32, [c_client, ptr, ptr, i64, p_error]),
        # ABI 1.2
        "pagealloc_reserve_options_init":
            (None, [ctypes.POINTER(ReserveOptions), size]),
        "pagealloc_reserve_create":
            (i32, [c_client, ctypes.POINTER(ReserveOptions),
                   ctypes.POINTER(ctypes.c_void_p), p_error]),
        "pagealloc_reserve_destroy": (None, [ptr]),
        "pagealloc_reserve_take": (i32, [ptr, i64, ptr, p_error]),
        "pagealloc_reserve_put": (i32, [ptr, ptr, size, p_error]),
        "pagealloc_reserve_get_stats":
            (i32, [ptr, ctypes.POINTER(ReserveStats), p_error]),
        # ABI 1.3
        "pagealloc_queue_release":
            (i32, [c_client, ptr, ctypes.POINTER(ctypes.c_uint64), p_error]),
        "pagealloc_free_slots_on_stream":
            (i32, [c_client, ptr, size, i32, ptr, p_i64, p_error]),
        "pagealloc_free_pages_on_stream":
            (i32, [c_client, ptr, size, i32, ptr, p_i64, p_error]),
        "pagealloc_free_pages_after":
            (i32, [c_client, ptr, size, i32, ctypes.c_uint64, p_i64,
                   p_error]),
        "pagealloc_reserve_put_on_stream":
            (i32, [ptr, ptr, size, ptr, p_error]),
        # ABI 1.4
        "pagealloc_publish": (i32, [c_client, ptr, ptr, size, ptr, i32, ptr,
                                    ptr, p_i64, p_error]),
        "pagealloc_match_prefix":
            (i32, [c_client, ptr, size, i32, ptr, p_i64, p_error]),
        "pagealloc_unpin_prefix": (i32, [c_client, ptr, size, p_i64, p_error]),
        "pagealloc_admin_reset_prefix_cache":
            (i32, [ctypes.POINTER(AdminOptions), p_i64, p_error]),
    }
    # ABI 1.3: declared only when the library has them, so that a 1.2
    # library still serves everything else.
    if lib.pagealloc_abi_version() & 0xFFFF >= 3:
        signatures.update({
            "pagealloc_reserve_alloc_extend":
                (i32, [ptr, i32, size, ptr, ptr, ptr, ptr, ptr, p_i64,
                       p_error]),
            "pagealloc_reserve_alloc_decode":
                (i32, [ptr, i32, size, ptr, ptr, ptr, ptr, p_i64, p_error]),
            "pagealloc_reserve_take_device_error": (i32, [ptr, p_error]),
        })
    if lib.pagealloc_abi_version() & 0xFFFF >= 5:  # ABI 1.5
        signatures["pagealloc_reserve_last_expansion_pages"] = (
            i32, [ptr, i32, ptr, size, p_i64, p_error])
    if lib.pagealloc_abi_version() & 0xFFFF >= 6:  # ABI 1.6
        signatures["pagealloc_reserve_peek"] = (
            i32, [ptr, ptr, size, p_i64, p_error])
    if lib.pagealloc_abi_version() & 0xFFFF >= 8:  # ABI 1.8
        signatures.update({
            "pagealloc_reserve_free_slots":
                (i32, [ptr, i32, ptr, size, ptr, i32, ptr, ptr, p_i64,
                       p_error]),
            "pagealloc_reserve_disown": (i32, [ptr, ptr, size, p_i64,
                                               p_error]),
        })
    if lib.pagealloc_abi_version() & 0xFFFF >= 7:  # ABI 1.7
        signatures.update({
            "pagealloc_resume":
                (i32, [ctypes.POINTER(ClientOptions), ctypes.c_uint64,
                       ctypes.c_char_p, size, i32,
                       ctypes.POINTER(ctypes.c_void_p), p_error]),
            "pagealloc_detach": (i32, [c_client, p_error]),
            "pagealloc_session_resumable": (i32, [c_client]),
            "pagealloc_link_epoch": (ctypes.c_uint64, [c_client]),
            "pagealloc_reconnecting": (i32, [c_client]),
        })
    if lib.pagealloc_abi_version() & 0xFFFF >= 9:  # ABI 1.9
        signatures.update({
            "pagealloc_calls_sent_again": (ctypes.c_uint64, [c_client]),
            "pagealloc_list_pages":
                (i32, [c_client, ptr, size, ctypes.POINTER(size), p_error]),
        })
    if lib.pagealloc_abi_version() & 0xFFFF >= 10:  # ABI 1.10
        signatures["pagealloc_reserve_take_held"] = (
            i32, [ptr, ptr, size, p_i64, p_error])
        signatures["pagealloc_reserve_put_under"] = (
            i32, [ptr, ptr, size, ptr, i32, p_error])
    if lib.pagealloc_abi_version() & 0xFFFF >= 11:  # ABI 1.11
        signatures["pagealloc_copy_to_host_async"] = (
            i32, [ptr, size, ptr, ptr, p_error])
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes


def load():
    path = library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            "pagealloc: cannot load %s (%s). Set PAGEALLOC_LIBRARY to the "
            "library's path, or install the wheel that carries it; the "
            "library needs Debian 12's gRPC, protobuf and Abseil shared "
            "libraries (docs/python.md)." % (path, e)) from e
    lib.pagealloc_abi_version.restype = ctypes.c_uint32
    version = lib.pagealloc_abi_version()
    if (version >> 16 != ABI_VERSION_MAJOR or
            version & 0xFFFF < ABI_VERSION_MINOR):
        raise ImportError(
            "pagealloc: %s has ABI %d.%d; this package needs ABI %d.%d or a "
            "later %d.x" % (path, version >> 16, version & 0xFFFF,
                            ABI_VERSION_MAJOR, ABI_VERSION_MINOR,
                            ABI_VERSION_MAJOR))
    _declare(lib)
    return lib, path


lib, path = load()

MEMORY_HOST = 0    # pagealloc_memory: host arrays
MEMORY_DEVICE = 1  # CUDA device memory, on the caller's stream
# Whether the library has ABI 1.3's in-process expansion.
HAS_LOCAL_EXPANSION = lib.pagealloc_abi_version() & 0xFFFF >= 3
# Whether it also says which pages an expansion took (ABI 1.5).
HAS_EXPANSION_PAGES = lib.pagealloc_abi_version() & 0xFFFF >= 5
# Whether a reserve names its next pages without handing them out (1.6).
HAS_RESERVE_PEEK = lib.pagealloc_abi_version() & 0xFFFF >= 6
# Whether sessions can be resumed and clients reconnect (1.7).
HAS_RESUME = lib.pagealloc_abi_version() & 0xFFFF >= 7
# Calls sent again by id after a restart are counted (1.9).
HAS_CALL_IDS = lib.pagealloc_abi_version() & 0xFFFF >= 9
# Whether a reserve frees whole pages of slots in one call, device slots
# copied on the caller's stream, and lets go of published pages (1.8).
HAS_RESERVE_FREE_SLOTS = lib.pagealloc_abi_version() & 0xFFFF >= 8
# Whether a reserve takes what it holds with no round trip, and puts pages
# under what it holds (1.10).
HAS_RESERVE_TAKE_HELD = lib.pagealloc_abi_version() & 0xFFFF >= 10
HAS_RESERVE_PUT_UNDER = HAS_RESERVE_TAKE_HELD
# Whether it queues a copy of device memory to the host on a stream (1.11).
HAS_COPY_TO_HOST = lib.pagealloc_abi_version() & 0xFFFF >= 11
