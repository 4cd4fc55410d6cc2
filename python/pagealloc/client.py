"""pagealloc.Client: a session with a pagealloc daemon, from Python.

A thin layer over libpagealloc_client.so (client/pagealloc.h): the same
sessions, leases, fast channel and output ring as the C++ client. See
docs/python.md.
"""

import ctypes
import dataclasses
import sys
import threading
from typing import List, Optional

import numpy as np

from pagealloc import _native
from pagealloc.errors import (FailedPreconditionError, InvalidArgumentError,
                              PageallocError,
                              StatusCode, error_for)

_lib = _native.lib
_tls = threading.local()

# The allocation calls' C functions, looked up once (ctypes converts their
# arguments by the argtypes _native declared).
_alloc_extend_c = _lib.pagealloc_alloc_extend
_alloc_decode_c = _lib.pagealloc_alloc_decode
_alloc_c = _lib.pagealloc_alloc
_get_view_c = _lib.pagealloc_allocation_get_view
_release_c = _lib.pagealloc_release
_order_after_c = _lib.pagealloc_order_after

_INT64 = np.dtype(np.int64)


class _CallContext:
    """One thread's pagealloc_error and a ctypes reference to it, built
    once and reused by every call of the thread (a failed call's message is
    read before the thread's next call; the allocation handle, which must
    never be read from another call, is a new out-parameter per call)."""

    __slots__ = ("error", "error_ref")

    def __init__(self):
        self.error = _native.Error()
        self.error_ref = ctypes.byref(self.error)


def _call_context():
    """This thread's _CallContext."""
    try:
        return _tls.context
    except AttributeError:
        _tls.context = _CallContext()
        return _tls.context


def _error_buffer():
    """This thread's pagealloc_error (one per thread, reused by every call)."""
    return _call_context().error


def _raise(code, error):
    raise error_for(code, error.message.decode("utf-8", "replace"))


def _check(code, error):
    if code != 0:
        _raise(code, error)


# --------------------------------------------------------------------------
# Arrays in: lists, NumPy arrays, CPU tensors
# --------------------------------------------------------------------------

def _int64_array(values, name):
    """`values` as a one-dimensional, contiguous int64 NumPy array (no copy
    when it is one already)."""
    if (type(values) is np.ndarray and values.dtype is _INT64 and
            values.ndim == 1 and values.flags.c_contiguous):
        return values
    if isinstance(values, np.ndarray):
        array = values
    elif isinstance(values, CudaSlots):
        array = values.copy_to_host()
    else:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(values, torch.Tensor):
            if values.device.type != "cpu":
                raise InvalidArgumentError(
                    "%s is a tensor on %s; pass a CPU tensor or array (the "
                    "call reads host memory)" % (name, values.device))
            array = values.detach().numpy()
        else:
            array = np.asarray(values)
            if array.size == 0:
                array = array.astype(np.int64)
    if array.ndim != 1:
        raise InvalidArgumentError("%s must be one-dimensional, not of shape %s"
                                   % (name, array.shape))
    if array.dtype != np.int64:
        if array.dtype.kind not in "iu":
            raise InvalidArgumentError("%s has dtype %s; integers expected" %
                                       (name, array.dtype))
        array = array.astype(np.int64)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return array


def _address(array):
    return array.ctypes.data


# --------------------------------------------------------------------------
# Arrays out: zero-copy views that keep their allocation alive
# --------------------------------------------------------------------------

class _HostArray:
    """An __array_interface__ over memory the library owns; `owner` (an
    Allocation) keeps it mapped as long as a NumPy array built on this
    object lives (the array's .base is this object)."""

    __slots__ = ("__array_interface__", "_owner")

    def __init__(self, address, count, typestr, owner):
        self.__array_interface__ = {
            "shape": (count,),
            "typestr": typestr,
            "data": (address, True),  # read-only: the daemon writes it
            "version": 3,
        }
        self._owner = owner


def _host_view(address, count, typestr, owner):
    if count == 0 or not address:
        return np.empty(0, dtype=np.dtype(typestr))
    return np.asarray(_HostArray(address, count, typestr, owner))


class CudaSlots:
    """Slots in GPU memory (the CUDA backend's ring), zero-copy.

    Implements __cuda_array_interface__ (version 3), so that
    `torch.as_tensor(slots, device="cuda")`, `cupy.asarray(slots)` and Numba
    alias the ring without a copy; the tensor keeps this object, and with it
    the allocation, alive. The interface's "stream" is None: the slots of a
    synchronous call are written when the call returns, and those of an
    async_completion call are ordered by Client.order_after_completion,
    not by a stream the producer names. The memory is marked writable
    because PyTorch refuses read-only CUDA arrays; do not write it (the
    daemon owns it).
    """

    __slots__ = ("_address", "_count", "_owner")

    def __init__(self, address, count, owner):
        self._address = address or 0
        self._count = count
        self._owner = owner

    @property
    def __cuda_array_interface__(self):
        return {
            "shape": (self._count,),
            "typestr": "<i8",
            "data": (self._address, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }

    @property
    def ptr(self):
        """The device address of the first slot."""
        return self._address

    @property
    def shape(self):
        return (self._count,)

    dtype = np.dtype(np.int64)

    def __len__(self):
        return self._count

    def copy_to_host(self):
        """The slots as a new host NumPy array (a device-to-host copy)."""
        return self._owner._client._copy_to_host(self._address, self._count)

    def __repr__(self):
        return "CudaSlots(ptr=0x%x, count=%d)" % (self._address, self._count)


def _slot_view(address, count, on_device, owner):
    if on_device:
        return CudaSlots(address, count, owner)
    return _host_view(address, count, "<i8", owner)


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PoolInfo:
    page_size: int
    num_pages: int      # usable pages, ids 1..num_pages
    backend: str        # "cpu" or "cuda"
    gpu: int            # CUDA device ordinal (CUDA backend)
    device_uuid: str    # "" on the CPU backend
    free_policy: str    # "lifo" or "sorted"
    # "pagealloc" (the daemon's own contract) or "sglang" (SGLang's
    # allocators where they differ): the daemon's --semantics.
    semantics: str = "pagealloc"


@dataclasses.dataclass(frozen=True)
class Stats:
    """The daemon's pool figures (GetStats)."""
    pool: PoolInfo
    free_pages: int             # in the free list
    parked_pages: int           # freed under "sorted", not yet merged
    used_pages: int             # owned by sessions
    slots_allocated_total: int
    pages_allocated_total: int
    pages_freed_total: int
    out_of_pages_total: int     # requests refused for want of pages
    free_list_sorts_total: int
    launches_total: int
    sessions_active: int
    # Shared prefix pages (ABI 1.5; 0 from an older library): held by a
    # session, held by none with their KV valid, pinned, cached without a
    # pin (evictable); keys looked up by matches, and found, since start.
    prefix_published_pages: int = 0
    prefix_cached_pages: int = 0
    prefix_pinned_pages: int = 0
    prefix_evictable_pages: int = 0
    prefix_lookup_pages_total: int = 0
    prefix_hit_pages_total: int = 0


@dataclasses.dataclass(frozen=True)
class RingInfo:
    """The session's mapped output ring."""
    address: int
    capacity_slots: int
    on_device: bool


@dataclasses.dataclass(frozen=True)
class RequestResult:
    """One request of an allocation call."""
    index: int
    code: StatusCode
    message: str  # "" when served
    # The request's slots (a NumPy array on the host, CudaSlots on the GPU);
    # None when refused.
    slots: object
    count: int
    new_pages: int

    @property
    def ok(self):
        return self.code == StatusCode.OK

    @property
    def error(self) -> Optional[PageallocError]:
        """The refusal as an exception object (not raised), or None."""
        return None if self.ok else error_for(self.code, self.message)


_BACKENDS = {0: "unspecified", 1: "cpu", 2: "cuda"}


def _pool_info(raw, semantics):
    return PoolInfo(page_size=raw.page_size, num_pages=raw.num_pages,
                    backend=_BACKENDS.get(raw.backend, str(raw.backend)),
                    gpu=raw.gpu, device_uuid=raw.device_uuid.decode(),
                    free_policy=raw.free_policy.decode(),
                    semantics=semantics)


class Allocation:
    """The result of one allocation call.

    Slots are views, not copies: into the session's mapped output ring, or,
    for return_inline calls, into host memory this object owns. Ring views
    stay valid until this allocation, or a later one, is released
    (Client.release / Allocation.release / leaving a `with` block on it);
    after that the daemon writes new slots there. Every view keeps this
    object (and its client) alive, so memory is never unmapped under a
    view; a released view simply shows later allocations' slots.
    Requests the daemon refused (e.g. RESOURCE_EXHAUSTED) are not raised:
    `ok` is False, `codes` says which, `check()` raises the first.
    """

    def __init__(self, client, handle, inline):
        self._client = client
        self._handle = handle
        self._inline = inline
        view = _get_view_c(handle).contents
        self._view = view
        self.num_requests = view.num_requests
        self.num_refused = view.num_refused
        self.ring_end = view.ring_end
        self.pages_freed_first = view.pages_freed_first
        self.batch_requests = view.batch_requests
        self.on_device = bool(view.on_device)
        # The value the pool's completion counter reaches once this call's
        # slots are written (Client.order_after waits for it on the GPU; on
        # the CPU backend it numbers the launches).
        self.completion_value = view.completion_value
        # The client's link to the daemon that answered (Client.link_epoch):
        # ring_end counts within one link (ABI 1.7; 0 before).
        self.link_epoch = view.link_epoch if _native.HAS_RESUME else 0
        self._num_slots = view.num_slots
        # Views are made on each access, never kept here: a view refers to
        # this object, and NumPy arrays are not tracked by the cycle
        # collector, so a kept view would keep this object forever.

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and _lib is not None:
            _lib.pagealloc_allocation_destroy(handle)

    def __len__(self):
        return self.num_requests

    def __getitem__(self, i):
        if not -self.num_requests <= i < self.num_requests:
            raise IndexError("request %d of %d" % (i, self.num_requests))
        i %= self.num_requests
        code = StatusCode(int(self.codes[i]))
        message = self._view.messages[i].decode("utf-8", "replace")
        count = int(self.counts[i])
        slots = None
        if code == StatusCode.OK:
            address = ctypes.c_void_p.from_address(
                self._view.slots + i * ctypes.sizeof(ctypes.c_void_p)).value
            slots = _slot_view(address, count, self.on_device, self)
        return RequestResult(index=i, code=code, message=message, slots=slots,
                             count=count, new_pages=int(self.new_pages[i]))

    def __iter__(self):
        for i in range(self.num_requests):
            yield self[i]

    @property
    def ok(self):
        """True when every request was served."""
        return self.num_refused == 0

    @property
    def inline(self):
        """True for return_inline results (host memory owned here)."""
        return self._inline

    @property
    def slots(self):
        """Every served request's slots, in request order, as one zero-copy
        array (NumPy on the host, CudaSlots on the GPU). Raises ValueError
        when a refused request lies between served ones (its place in the
        ring is a gap): read the requests one by one then."""
        if self._num_slots < 0:
            raise ValueError(
                "the served requests' slots are not one run (a refused "
                "request lies between them); use allocation[i].slots")
        return _slot_view(self._view.all_slots, self._num_slots,
                          self.on_device, self)

    @property
    def num_slots(self):
        """Slots of the served requests, or -1 when not one run."""
        return self._num_slots

    @property
    def codes(self):
        """Per-request status codes (int32; 0 = served), zero-copy."""
        return _host_view(self._view.codes, self.num_requests, "<i4", self)

    @property
    def counts(self):
        """Per-request slot counts (int64; 0 when refused), zero-copy."""
        return _host_view(self._view.counts, self.num_requests, "<i8", self)

    @property
    def new_pages(self):
        """Pages each request was given (int64), zero-copy."""
        return _host_view(self._view.new_pages, self.num_requests, "<i8",
                          self)

    def check(self):
        """Raises the first refused request's error; returns self."""
        if self.num_refused:
            error = _error_buffer()
            code = _lib.pagealloc_allocation_status(self._handle,
                                                    ctypes.byref(error))
            _check(code, error)
        return self

    def release(self):
        """Lets the daemon reuse this allocation's ring space, and that of
        every allocation before it (Client.release)."""
        self._client.release(self)

    @property
    def released(self):
        """True once this allocation's ring space may be reused (never for
        inline results, which live in this object)."""
        return not self._inline and self._client._is_released(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __repr__(self):
        return ("Allocation(requests=%d, refused=%d, slots=%d, ring_end=%d, "
                "on_device=%s)" % (self.num_requests, self.num_refused,
                                   self._num_slots, self.ring_end,
                                   self.on_device))


class FreeGroup:
    """Collects the frees of one scheduler step into one Free call (SGLang's
    free_group_begin / free_group_end). As a context manager it sends the
    call when the block ends normally, and nothing when it raises."""

    def __init__(self, client, order=None):
        self._client = client
        self._order = order
        self._parts: List[np.ndarray] = []
        self.pages_freed = None  # set by end()

    def add(self, slots):
        """Adds slots to free (copied now: a ring view may be reused before
        the group ends)."""
        self._parts.append(np.array(_int64_array(slots, "slots"), copy=True))

    def end(self):
        """Frees everything added (one call; none when empty); returns the
        pages freed."""
        parts, self._parts = self._parts, []
        if not parts:
            self.pages_freed = 0
        else:
            self.pages_freed = self._client.free(np.concatenate(parts),
                                                 order=self._order)
        return self.pages_freed

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        if exc_type is None:
            self.end()
        return False


def _seconds_to_ms(value, name):
    return _seconds_in(value, name, 1000)


def _seconds_in(value, name, per_second):
    """`value` seconds in units of 1 / per_second (0 for None)."""
    if value is None:
        return 0
    units = int(round(value * per_second))
    if units < 0:
        raise InvalidArgumentError("%s (%r s) is negative" % (name, value))
    return units


_FREE_ORDERS = {None: 0, "ascending": 1, "first_appearance": 2}


# The pagealloc_call_options of each combination of the flag options, built
# once: (structure, reference) by (return_inline, async_completion,
# checkpoint_first, all_or_nothing). The library only reads the structure
# during a call, so every thread shares them.
_CALL_OPTIONS = {}


def _call_options_ref(return_inline, async_completion, checkpoint_first,
                      all_or_nothing):
    """A reference to the shared pagealloc_call_options with these flags and
    no free_pages_first, or None (the defaults) when every flag is off."""
    key = (bool(return_inline), bool(async_completion),
           bool(checkpoint_first), bool(all_or_nothing))
    entry = _CALL_OPTIONS.get(key)
    if entry is None:
        if not any(key):
            return None
        options = _native.CallOptions()
        _lib.pagealloc_call_options_init(ctypes.byref(options),
                                         ctypes.sizeof(options))
        (options.return_inline, options.async_completion,
         options.checkpoint_first, options.all_or_nothing) = (
             int(flag) for flag in key)
        entry = (options, ctypes.byref(options))
        _CALL_OPTIONS[key] = entry
    return entry[1]


def _free_order(order):
    """The pagealloc_free_order number of a free's `order` argument."""
    try:
        return _FREE_ORDERS[order]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            "order must be None, \"ascending\" or \"first_appearance\", "
            "not %r" % (order,)) from None


def _stream_handle(stream):
    """A cudaStream_t as an int from a torch or CuPy stream, an int, or
    None (0: the legacy default stream)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "cuda_stream"):   # torch.cuda.Stream
        return int(stream.cuda_stream)
    if hasattr(stream, "ptr"):           # cupy.cuda.Stream
        return int(stream.ptr)
    raise InvalidArgumentError(
        "stream must be a torch or CuPy stream, an int handle or None, not "
        "%s" % type(stream).__name__)


class FreeLists(tuple):
    """(free_pages, parked_pages): int64 NumPy arrays, read by
    Client.free_lists or get_free_lists. `free_count` and `parked_count`
    are the lists' whole lengths (more than the arrays hold when cut at
    max_pages)."""

    def __new__(cls, free_pages, parked_pages, free_count, parked_count):
        self = super().__new__(cls, (free_pages, parked_pages))
        self.free_count = free_count
        self.parked_count = parked_count
        return self

    @property
    def free_pages(self):
        return self[0]

    @property
    def parked_pages(self):
        return self[1]

    def __repr__(self):
        return "FreeLists(free_pages=%s, parked_pages=%s, free_count=%d, " \
            "parked_count=%d)" % (self[0].tolist(), self[1].tolist(),
                                  self.free_count, self.parked_count)


_MAX_FREE_LIST_PAGES = 1 << 20


def _new_free_lists(max_pages):
    """A pagealloc_free_lists with two buffers of `max_pages` entries."""
    if (not isinstance(max_pages, (int, np.integer)) or
            isinstance(max_pages, bool) or
            not 0 <= max_pages <= _MAX_FREE_LIST_PAGES):
        raise InvalidArgumentError(
            "max_pages (%r) must be an integer in [0, %d]" %
            (max_pages, _MAX_FREE_LIST_PAGES))
    free = np.empty(int(max_pages), dtype=np.int64)
    parked = np.empty(int(max_pages), dtype=np.int64)
    lists = _native.FreeLists()
    _lib.pagealloc_free_lists_init(ctypes.byref(lists), ctypes.sizeof(lists))
    lists.free_pages = _address(free) if free.size else None
    lists.free_capacity = free.size
    lists.parked_pages = _address(parked) if parked.size else None
    lists.parked_capacity = parked.size
    return lists, free, parked


def _free_lists_result(lists, free, parked):
    return FreeLists(free[:lists.num_free].copy(),
                     parked[:lists.num_parked].copy(), lists.free_count,
                     lists.parked_count)


def _admin_options(target, timeout):
    options = _native.AdminOptions()
    _lib.pagealloc_admin_options_init(ctypes.byref(options),
                                      ctypes.sizeof(options))
    options.target = str(target).encode() if target is not None else b""
    options.timeout_ms = _seconds_to_ms(timeout, "timeout")
    return options


def clear_pool(target, *, force=False, timeout=5.0) -> int:
    """Resets the whole pool of the daemon at `target` to its first state
    (an operator's call: it needs no session). Returns the pages freed.
    FailedPreconditionError, naming the sessions' pages, while any session
    holds pages, unless force=True, which the daemon refuses
    (PermissionDeniedError) unless it runs with --allow_forced_clear; a
    forced clear voids every session's slots without telling them."""
    options = _admin_options(target, timeout)
    freed = ctypes.c_int64()
    error = _error_buffer()
    _check(_lib.pagealloc_admin_clear_pool(ctypes.byref(options),
                                           1 if force else 0,
                                           ctypes.byref(freed),
                                           ctypes.byref(error)), error)
    return freed.value


def reset_prefix_cache(target, *, timeout=5.0) -> int:
    """Evicts every cached, unpinned shared prefix page of the daemon at
    `target` (an operator's call: it needs no session); returns the pages
    evicted. Published and pinned pages stay."""
    options = _admin_options(target, timeout)
    evicted = ctypes.c_int64()
    error = _error_buffer()
    _check(_lib.pagealloc_admin_reset_prefix_cache(ctypes.byref(options),
                                                   ctypes.byref(evicted),
                                                   ctypes.byref(error)), error)
    return evicted.value


PREFIX_KEY_BYTES = 32


def _key_chain(keys, name="keys"):
    """`keys` (bytes-like, PREFIX_KEY_BYTES each) as one contiguous buffer.
    InvalidArgumentError naming keys[i] for another size; the daemon
    refuses repeats and chains longer than the pool."""
    joined = bytearray()
    for i, key in enumerate(keys):
        try:
            raw = bytes(key)
        except TypeError:
            raise InvalidArgumentError(
                "%s[%d] is a %s, not bytes" % (name, i, type(key).__name__))
        if len(raw) != PREFIX_KEY_BYTES:
            raise InvalidArgumentError(
                "%s[%d] is %d bytes; a prefix key is %d bytes" %
                (name, i, len(raw), PREFIX_KEY_BYTES))
        joined += raw
    return np.frombuffer(bytes(joined), dtype=np.uint8), \
        len(joined) // PREFIX_KEY_BYTES


def device_to_host_copier():
    """A function copy(device_address, nbytes, host_address, stream) that
    queues on `stream` (a cudaStream_t as an int; 0: the legacy default
    stream) the copy of `nbytes` bytes of CUDA memory to pinned host
    memory, and returns without waiting (pagealloc_copy_to_host_async, ABI
    1.11); the caller reads the host memory once an event recorded on the
    stream after the call has passed. Raises on a refusal. One CUDA call,
    where a tensor's copy_ dispatches an operation first (the token
    allocator's free, _unread_frees.py). For one thread at a time: the
    function keeps one error record."""
    if not _native.HAS_COPY_TO_HOST:
        raise FailedPreconditionError(
            "%s cannot copy device slots to the host (ABI 1.11 needed)" %
            _native.path)
    function = _lib.pagealloc_copy_to_host_async
    error = _native.Error()
    error_ref = ctypes.byref(error)

    def copy(device_address, nbytes, host_address, stream):
        code = function(device_address, nbytes, host_address, stream,
                        error_ref)
        if code:
            _raise(code, error)

    return copy


def get_free_lists(target, max_pages=4096, *, timeout=5.0):
    """Client.free_lists of the daemon at `target`, without a session."""
    options = _admin_options(target, timeout)
    lists = _new_free_lists(max_pages)
    error = _error_buffer()
    _check(_lib.pagealloc_admin_get_free_lists(ctypes.byref(options),
                                               ctypes.byref(lists[0]),
                                               ctypes.byref(error)), error)
    return _free_lists_result(*lists)


# --------------------------------------------------------------------------
# KV buffers
# --------------------------------------------------------------------------

# The array-interface typestr of each KV dtype. bf16 and the fp8 formats
# have no NumPy dtype: their NumPy and CUDA-array views are of their raw
# bits, uint16 and uint8 (KvBuffer.as_torch gives the real dtype).
_KV_TYPESTR = {
    "bf16": "<u2", "fp16": "<f2", "fp32": "<f4", "fp8_e4m3": "|u1",
    "fp8_e5m2": "|u1", "int8": "|i1", "uint8": "|u1", "int32": "<i4",
}
# The raw typestr torch reads before KvBuffer.as_torch views the tensor as
# its dtype (int16 for bf16: older torch has no uint16).
_KV_TORCH_RAW = {"bf16": "<i2"}
_KV_TORCH_DTYPE = {
    "bf16": "bfloat16", "fp16": "float16", "fp32": "float32",
    "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "int8": "int8",
    "uint8": "uint8", "int32": "int32",
}


class _KvInterface:
    """One KV buffer's array interface with a chosen typestr, for
    KvBuffer.as_torch; keeps the buffer (and its client) alive."""

    __slots__ = ("_buffer", "_typestr")

    def __init__(self, buffer, typestr):
        self._buffer = buffer
        self._typestr = typestr

    @property
    def __array_interface__(self):
        return self._buffer._interface(self._typestr, host=True)

    @property
    def __cuda_array_interface__(self):
        return self._buffer._interface(self._typestr, host=False)


class KvBuffer:
    """One buffer of the pool's KV slab, mapped in this process: a
    [num_slots, *element_shape] array of `dtype`, slot-major, the same bytes
    in every session of the pool. Slot s's element (a slot an allocation
    gave) is at pointer + s * stride_bytes; attention kernels read and
    write it in place.

    Zero copy: on the CPU backend `numpy.asarray(buf)` (through
    __array_interface__, writable), on the CUDA backend
    `torch.as_tensor(buf, device="cuda")` or `cupy.asarray(buf)` (through
    __cuda_array_interface__). bf16 and fp8 have no NumPy dtype: those
    views hold the raw bits, uint16 (bf16) and uint8 (fp8_e4m3, fp8_e5m2);
    `as_torch()` gives a tensor of the real dtype (torch.bfloat16,
    torch.float8_e4m3fn, ...). Every view keeps the buffer, and with it the
    client and its mapping, alive.
    """

    __slots__ = ("_client", "name", "dtype", "itemsize", "element_shape",
                 "num_slots", "stride_bytes", "pointer", "on_device",
                 "device")

    def __init__(self, client, index):
        raw = _native.KvBuffer()
        raw.struct_size = ctypes.sizeof(raw)
        error = _error_buffer()
        _check(_lib.pagealloc_kv_buffer_get(client._handle, index,
                                            ctypes.byref(raw),
                                            ctypes.byref(error)), error)
        self._client = client
        self.name = raw.name.decode()
        self.dtype = raw.dtype.decode()      # "bf16", "fp32", ...
        self.itemsize = raw.dtype_bytes      # bytes of one value
        self.element_shape = tuple(raw.element_shape[i]
                                   for i in range(raw.rank))
        self.num_slots = raw.num_slots
        self.stride_bytes = raw.stride_bytes
        self.pointer = raw.data or 0         # slot 0 (device or host)
        self.on_device = bool(raw.on_device)
        self.device = raw.device             # CUDA ordinal; -1 on the CPU

    @property
    def shape(self):
        """(num_slots, *element_shape)."""
        return (self.num_slots,) + self.element_shape

    @property
    def nbytes(self):
        return self.num_slots * self.stride_bytes

    @property
    def typestr(self):
        """The views' typestr ("<u2" for bf16, "|u1" for fp8: raw bits)."""
        return _KV_TYPESTR[self.dtype]

    @property
    def strides(self):
        """Byte strides of the views: None when contiguous (the element's
        bytes are the slot stride, as every layout places them)."""
        element = [self.itemsize] if self.element_shape else []
        for d in reversed(self.element_shape[1:]):
            element.insert(0, element[0] * d)
        element_bytes = self.itemsize
        for d in self.element_shape:
            element_bytes *= d
        if self.stride_bytes == element_bytes:
            return None
        return (self.stride_bytes,) + tuple(element)

    def _interface(self, typestr, host):
        if host and self.on_device:
            raise AttributeError(
                "KV buffer %s is GPU memory: use torch.as_tensor(buf, "
                "device='cuda'), cupy.asarray(buf) or buf.as_torch()" %
                self.name)
        if not host and not self.on_device:
            raise AttributeError(
                "KV buffer %s is host memory (CPU backend): use "
                "numpy.asarray(buf)" % self.name)
        interface = {
            "shape": self.shape,
            "typestr": typestr,
            "data": (self.pointer, False),   # writable: kernels write KV
            "strides": self.strides,
            "version": 3,
        }
        if not host:
            # The slab is written by the sessions' own kernels, never by a
            # producer stream of ours: nothing to synchronise with.
            interface["stream"] = None
        return interface

    @property
    def __array_interface__(self):
        return self._interface(self.typestr, host=True)

    @property
    def __cuda_array_interface__(self):
        return self._interface(self.typestr, host=False)

    def as_torch(self):
        """The buffer as a torch tensor of its real dtype (torch.bfloat16,
        torch.float8_e4m3fn, ...), shape (num_slots, *element_shape), on
        cuda:<device> or the CPU; zero-copy (the raw bits viewed as the
        dtype). Needs torch (float8 dtypes: torch 2.1 or later)."""
        import torch
        dtype = getattr(torch, _KV_TORCH_DTYPE[self.dtype], None)
        if dtype is None:
            raise TypeError("this torch (%s) has no %s for KV buffer %s" %
                            (torch.__version__, _KV_TORCH_DTYPE[self.dtype],
                             self.name))
        raw = _KvInterface(self, _KV_TORCH_RAW.get(self.dtype, self.typestr))
        if self.on_device:
            tensor = torch.as_tensor(raw, device="cuda:%d" % self.device)
        else:
            tensor = torch.from_numpy(np.asarray(raw))
        return tensor if tensor.dtype == dtype else tensor.view(dtype)

    def slot_address(self, slot):
        """The address of slot `slot`'s element."""
        if not 0 <= slot < self.num_slots:
            raise IndexError("slot %d of %d" % (slot, self.num_slots))
        return self.pointer + int(slot) * self.stride_bytes

    def __len__(self):
        return self.num_slots

    def __repr__(self):
        return ("KvBuffer(name=%r, dtype=%r, shape=%s, stride_bytes=%d, "
                "on_device=%s)" % (self.name, self.dtype, self.shape,
                                   self.stride_bytes, self.on_device))


class PageReserve:
    """A session's reserve of whole pages in this process
    (client/page_reserve.h): the pages are the session's in the daemon's
    pool; take() hands them out without a round trip while the reserve
    holds them, and the reserve's thread refills and returns in the
    background. Thread-safe. Close it (or leave the `with` block) before
    its client; its pages go back to the daemon then.

        with client.reserve(initial_batch=16) as reserve:
            pages = reserve.take(4)    # int64 page ids, NumPy
            ...
            reserve.put(pages)         # back into the reserve
    """

    def __init__(self, client, *, initial_batch=None, max_pages=None,
                 tick=None, idle_ticks=None, starved_wait=None):
        options = _native.ReserveOptions()
        _lib.pagealloc_reserve_options_init(ctypes.byref(options),
                                            ctypes.sizeof(options))
        for field, value in (("initial_batch", initial_batch),
                             ("max_pages", max_pages),
                             ("idle_ticks", idle_ticks)):
            if value is not None:
                setattr(options, field, _whole(value, field))
        for field, value, name in (("tick_us", tick, "tick"),
                                   ("starved_wait_us", starved_wait,
                                    "starved_wait")):
            if value is not None:
                setattr(options, field, _seconds_in(value, name, 10**6))
        handle = ctypes.c_void_p()
        error = _error_buffer()
        _check(_lib.pagealloc_reserve_create(
            client._handle, ctypes.byref(options), ctypes.byref(handle),
            ctypes.byref(error)), error)
        self._client = client  # outlives the reserve
        # The handle, shared with the client, which destroys the reserve
        # first when it goes (a garbage-collected cycle finalizes its
        # objects in no set order, and the reserve uses the client).
        self._box = [handle.value]
        boxes = client.__dict__.setdefault("_reserve_boxes", [])
        boxes[:] = [box for box in boxes if box[0]]
        boxes.append(self._box)
        self.page_size = client.pool.page_size
        self._expansion_pages = np.empty(1024, dtype=np.int64)
        self._peeked = np.empty(0, dtype=np.int64)

    @property
    def _handle(self):
        box = getattr(self, "_box", None)
        return box[0] if box else None

    def take(self, n):
        """`n` page ids of the session (an int64 NumPy array). Raises
        ResourceExhaustedError, taking nothing, when the pool or the
        session's quota cannot supply them."""
        n = _whole(n, "n")
        pages = np.empty(n, dtype=np.int64)
        error = _error_buffer()
        _check(_lib.pagealloc_reserve_take(self._live(), n, _address(pages),
                                           ctypes.byref(error)), error)
        return pages

    def take_held(self, max_pages):
        """Up to `max_pages` of the pages the reserve holds now, taken as
        take() hands them out (an int64 NumPy array, maybe empty): never a
        round trip to the daemon. For what the reserve can spare, or all
        of it: a count read from stats() and then take()n races the
        reserve's thread, whose return past the high mark can leave the
        take short, and a short take refills on this thread. ABI 1.10;
        with an older library, a take of what stats() counts."""
        max_pages = _whole(max_pages, "max_pages")
        if not _native.HAS_RESERVE_TAKE_HELD:
            return self.take(min(max_pages, self.stats()["pages"]))
        pages = np.empty(max_pages, dtype=np.int64)
        count = ctypes.c_int64(0)
        error = _error_buffer()
        _check(_lib.pagealloc_reserve_take_held(
            self._live(), _address(pages), max_pages, ctypes.byref(count),
            ctypes.byref(error)), error)
        return pages[:count.value]

    def peek(self, max_pages):
        """The pages the next takes would hand out, the next first: up to
        `max_pages` of those the reserve holds now, as an int64 NumPy
        array. Nothing is taken (its thread may return them, or a put push
        pages on top, before a take; its refills go underneath); ABI
        1.6."""
        if not _native.HAS_RESERVE_PEEK:
            raise FailedPreconditionError(
                "%s cannot name a reserve's next pages (ABI 1.6 needed)" %
                _native.path)
        max_pages = _whole(max_pages, "max_pages")
        pages = self._peeked
        if pages.size < max_pages:
            self._peeked = pages = np.empty(max_pages, dtype=np.int64)
        count = ctypes.c_int64(0)
        error = _error_buffer()
        _check(_lib.pagealloc_reserve_peek(
            self._live(), _address(pages), max_pages, ctypes.byref(count),
            ctypes.byref(error)), error)
        return pages[:count.value].copy()

    def put(self, pages, stream=None):
        """Puts pages taken from this reserve back into it. Raises
        InvalidArgumentError, changing nothing, for a page it did not hand
        out. With a `stream` (as Client.free_pages') the pages are tagged
        with a release value queued on it, so that their return to the
        daemon waits for the work queued there before (the release
        fence)."""
        array = _int64_array(pages, "pages")
        error = _error_buffer()
        if stream is None:
            _check(_lib.pagealloc_reserve_put(
                self._live(), _address(array), array.size,
                ctypes.byref(error)), error)
        else:
            _check(_lib.pagealloc_reserve_put_on_stream(
                self._live(), _address(array), array.size,
                _stream_handle(stream) or None, ctypes.byref(error)), error)

    def put_under(self, pages, stream=None):
        """put(), with the pages going under those the reserve holds, as
        a refill's do: they leave after every page it holds now, pages[0]
        first (the back of a free list, where SGLang's token allocator
        queues its frees), and a return to the daemon takes them first.
        ABI 1.10."""
        if not _native.HAS_RESERVE_PUT_UNDER:
            raise FailedPreconditionError(
                "%s cannot put pages under a reserve's (ABI 1.10 needed)" %
                _native.path)
        array = _int64_array(pages, "pages")
        error = _error_buffer()
        _check(_lib.pagealloc_reserve_put_under(
            self._live(), _address(array), array.size,
            _stream_handle(stream) or None, int(stream is not None),
            ctypes.byref(error)), error)

    def disown(self, pages):
        """Keeps `pages` (ids this reserve handed out) out of its books for
        good: they stay the session's, freed through the daemon, and put()
        and free_slots() refuse them from now on (pages published to the
        prefix index, which are shared). Pages it has not handed out are
        skipped. Returns how many it let go of; ABI 1.8."""
        if not _native.HAS_RESERVE_FREE_SLOTS:
            raise FailedPreconditionError(
                "%s cannot disown a reserve's pages (ABI 1.8 needed)" %
                _native.path)
        array = _int64_array(pages, "pages")
        count = ctypes.c_int64(0)
        error = _error_buffer()
        _check(_lib.pagealloc_reserve_disown(
            self._live(), _address(array), array.size, ctypes.byref(count),
            ctypes.byref(error)), error)
        return count.value

    def free_slots(self, slots, pages, *, host_copy=None, stream=None,
                   fence=False):
        """Frees whole pages of slots into this reserve in one call (ABI
        1.8; client/page_free.h): page_size slots a page, each page's in
        order from its first slot; the first page named is the next one a
        take hands out. Writes the pages' ids, in the order named, to
        `pages` (an int64 NumPy array with room for len(slots) //
        page_size) and returns their number.

        `slots` is a host array, or CUDA memory (a one-dimensional int64
        torch tensor, or anything with __cuda_array_interface__): that is
        copied on `stream` (as alloc_extend's) into `host_copy` (an int64
        host array of at least len(slots), pinned for an asynchronous
        copy; made when None), where it stays (refused or not, unless
        `pages` is too short), and the call waits for the stream; the pages are put untagged, the work queued before the free
        being done. Host slots with `fence` are tagged with a release value
        queued on `stream`, as put(pages, stream). Raises
        InvalidArgumentError, and puts nothing, when the slots are not whole
        pages or a page was not handed out by this reserve or is named
        twice."""
        if not _native.HAS_RESERVE_FREE_SLOTS:
            raise FailedPreconditionError(
                "%s cannot free slots into a reserve (ABI 1.8 needed)" %
                _native.path)
        if type(pages) is not np.ndarray or pages.dtype is not _INT64:
            raise InvalidArgumentError("pages must be an int64 NumPy array")
        on_device, address = _cuda_int64(slots, "slots", 0, False)
        if on_device:
            n = _cuda_length(slots)
            if host_copy is None:
                host_copy = np.empty(n, dtype=np.int64)
            elif (type(host_copy) is not np.ndarray or
                  host_copy.dtype is not _INT64 or host_copy.size < n or
                  not host_copy.flags.c_contiguous):
                raise InvalidArgumentError(
                    "host_copy must be a contiguous int64 NumPy array of at "
                    "least %d entries" % n)
            memory, copy_address = _native.MEMORY_DEVICE, _address(host_copy)
            stream_handle = _expansion_stream(stream, slots)
        else:
            array = _int64_array(slots, "slots")
            n, address = array.size, _address(array)
            memory, copy_address = _native.MEMORY_HOST, None
            stream_handle = _stream_handle(stream) or None
        if pages.size < n // self.page_size:
            # Refused here, before any copy: host_copy is not written.
            raise InvalidArgumentError(
                "pages has room for %d ids; the slots name %d pages" %
                (pages.size, n // self.page_size))
        return self._free_slots_at(memory, address, n, stream_handle,
                                   1 if fence else 0, copy_address,
                                   _address(pages))

    def _free_slots_at(self, memory, address, n, stream, fence, copy_address,
                       pages_address):
        """free_slots for a caller that checked its arguments itself and
        keeps the memory at these addresses alive (pagealloc.sglang's
        buffers, made once): the library call alone, on the step's path."""
        count = ctypes.c_int64(0)
        error = _error_buffer()
        _check(_lib.pagealloc_reserve_free_slots(
            self._live(), memory, address, n, stream, fence, copy_address,
            pages_address, ctypes.byref(count), ctypes.byref(error)), error)
        return count.value

    def alloc_extend(self, prefix_lens, seq_lens, last_loc, out=None, *,
                     stream=None):
        """SGLang's alloc_extend in this process (docs/python.md, "Slots
        expanded in process"): request i grows from prefix_lens[i] to
        seq_lens[i] tokens, its new pages taken from this reserve (no round
        trip while it holds them). Returns the sum(seq_lens - prefix_lens)
        slots, request after request, in `out` (made when None) or a
        prefix of it.

        The lengths are host arrays (SGLang's *_cpu tensors, lists, NumPy).
        A `last_loc` in CUDA memory (a torch tensor, or anything with
        __cuda_array_interface__) is read on the device: the slots are
        written on `stream` (a torch/cupy stream or a cudaStream_t as an
        int; None: torch's current stream for a torch tensor, else the
        legacy default stream), into a CUDA `out`, and the call returns
        without waiting for the stream. A host `last_loc` gives host slots.
        Raises InvalidArgumentError naming the request and its values, and
        ResourceExhaustedError when the reserve cannot supply the pages
        (SGLang's None); nothing is taken then."""
        prefix = _int64_array(prefix_lens, "prefix_lens")
        seq = _int64_array(seq_lens, "seq_lens")
        if prefix.size != seq.size:
            raise InvalidArgumentError(
                "prefix_lens has %d entries and seq_lens %d: one each per "
                "request" % (prefix.size, seq.size))
        total = int(seq.sum() - prefix.sum()) if seq.size else 0
        return self._expand("pagealloc_reserve_alloc_extend", (prefix,), seq,
                            last_loc, out, stream, total)

    def alloc_decode(self, seq_lens, last_loc, out=None, *, stream=None):
        """SGLang's alloc_decode in this process: one new token for each
        request, whose sequence reaches seq_lens[i] tokens with it. Returns
        len(seq_lens) slots. As alloc_extend with prefix_lens = seq_lens -
        1."""
        seq = _int64_array(seq_lens, "seq_lens")
        return self._expand("pagealloc_reserve_alloc_decode", (), seq,
                            last_loc, out, stream, seq.size)

    def last_expansion_pages(self, on_device):
        """The page ids the last alloc_extend / alloc_decode with a device
        (`on_device`) or a host last_loc took from this reserve, request
        after request, as an int64 NumPy array; empty after a refused call.
        A caller whose slots went to the device keeps its host record of
        the pages it may free or put back from these (ABI 1.5)."""
        if not _native.HAS_EXPANSION_PAGES:
            raise FailedPreconditionError(
                "%s does not report an expansion's pages (ABI 1.5 needed)" %
                _native.path)
        memory = _native.MEMORY_DEVICE if on_device else _native.MEMORY_HOST
        pages = self._expansion_pages
        count = ctypes.c_int64(0)
        error = _error_buffer()
        _check(_lib.pagealloc_reserve_last_expansion_pages(
            self._live(), memory, _address(pages), pages.size,
            ctypes.byref(count), ctypes.byref(error)), error)
        if count.value > pages.size:
            self._expansion_pages = pages = np.empty(
                max(count.value, 2 * pages.size), dtype=np.int64)
            _check(_lib.pagealloc_reserve_last_expansion_pages(
                self._live(), memory, _address(pages), pages.size,
                ctypes.byref(count), ctypes.byref(error)), error)
        return pages[:count.value].copy()

    def _alloc_decode_at(self, seq_address, n, loc_address, out_address,
                         stream):
        """alloc_decode for a caller that checked its arguments itself and
        keeps the memory at these addresses alive (pagealloc.sglang: the
        host seq_lens, a contiguous int64 CUDA last_loc and out of n
        entries, a cudaStream_t int): the library call alone, on the
        step's path. Returns the slots written."""
        written = ctypes.c_int64(-1)
        error = _error_buffer()
        _check(_lib.pagealloc_reserve_alloc_decode(
            self._live(), _native.MEMORY_DEVICE, n, seq_address, loc_address,
            out_address, stream, ctypes.byref(written), ctypes.byref(error)),
            error)
        return written.value

    def _expansion_pages_at(self, on_device, address, capacity):
        """last_expansion_pages into `capacity` int64s at `address` (a
        caller's buffer, kept alive by it); returns their number, of which
        the first `capacity` at most are written."""
        count = ctypes.c_int64(0)
        error = _error_buffer()
        _check(_lib.pagealloc_reserve_last_expansion_pages(
            self._live(),
            _native.MEMORY_DEVICE if on_device else _native.MEMORY_HOST,
            address, capacity, ctypes.byref(count), ctypes.byref(error)),
            error)
        return count.value

    def take_device_error(self):
        """Raises InvalidArgumentError for the first device last_loc the
        expansion kernel refused since the last call of this (its slots
        went to page 0, the padding page); covers the calls whose streams
        have been synchronized."""
        error = _error_buffer()
        _check(_lib.pagealloc_reserve_take_device_error(
            self._live(), ctypes.byref(error)), error)

    def _expand(self, function, prefix, seq, last_loc, out, stream, total):
        if not _native.HAS_LOCAL_EXPANSION:
            raise FailedPreconditionError(
                "%s has no in-process expansion (ABI 1.3 needed)" %
                _native.path)
        n = seq.size
        total = max(total, 0)  # bad lengths: the library says which
        on_device, loc_address = _cuda_int64(last_loc, "last_loc", n, True)
        if on_device:
            memory = _native.MEMORY_DEVICE
            if out is None:
                out = _new_device_int64(last_loc, total)
            out_on_device, out_address = _cuda_int64(out, "out", total, False)
            if not out_on_device:
                raise InvalidArgumentError(
                    "out must be CUDA memory, as last_loc is")
            stream_handle = _expansion_stream(stream, last_loc)
        else:
            memory = _native.MEMORY_HOST
            loc = _int64_array(last_loc, "last_loc")
            if loc.size != n:
                raise InvalidArgumentError(
                    "last_loc has %d entries and seq_lens %d" % (loc.size, n))
            if out is None:
                out = np.empty(total, dtype=np.int64)
            out_array = _host_out(out, total)
            loc_address = _address(loc)
            out_address = _address(out_array)
            stream_handle = None
        written = ctypes.c_int64(-1)
        error = _error_buffer()
        lengths = [_address(a) for a in prefix] + [_address(seq)]
        _check(getattr(_lib, function)(
            self._live(), memory, n, *lengths, loc_address, out_address,
            stream_handle, ctypes.byref(written), ctypes.byref(error)), error)
        return out if len(out) == written.value else out[:written.value]

    def stats(self):
        """The reserve's counts, as a dict (pages, handed_out, batch,
        refills, pages_refilled, returns, pages_returned, reclaims,
        sync_refills, takes, refills_refused, refills_backed_off)."""
        raw = _native.ReserveStats()
        raw.struct_size = ctypes.sizeof(raw)
        error = _error_buffer()
        _check(_lib.pagealloc_reserve_get_stats(
            self._live(), ctypes.byref(raw), ctypes.byref(error)), error)
        return {name: getattr(raw, name)
                for name, _ in _native.ReserveStats._fields_[1:]}

    def close(self):
        """Returns the reserve's pages to the daemon and stops its thread.
        Closing twice is fine."""
        _destroy_reserve(self._box)

    def _live(self):
        if not self._handle:
            raise FailedPreconditionError("the page reserve is closed")
        return self._handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        if getattr(self, "_box", None) and _lib is not None:
            _destroy_reserve(self._box)


def _destroy_reserve(box):
    handle, box[0] = box[0], None
    if handle:
        _lib.pagealloc_reserve_destroy(handle)


def _cuda_int64(array, name, count, exact):
    """(True, device address) for a one-dimensional, contiguous int64 CUDA
    array of `count` entries (at least `count` unless `exact`), (False,
    None) for anything not in CUDA memory. A torch tensor is read directly
    (its __cuda_array_interface__ costs microseconds a call)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        if not array.is_cuda:
            return False, None
        if (array.dtype != torch.int64 or array.dim() != 1 or
                not array.is_contiguous()):
            raise InvalidArgumentError(
                "%s must be a one-dimensional, contiguous int64 CUDA tensor, "
                "not %s of shape %s" % (name, array.dtype,
                                        tuple(array.shape)))
        _check_count(name, array.numel(), count, exact)
        return True, array.data_ptr()
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
        return False, None
    return True, _device_int64(interface, name, count, exact)


def _cuda_length(array):
    """The entries of a one-dimensional CUDA array _cuda_int64 accepted."""
    numel = getattr(array, "numel", None)
    if numel is not None:
        return numel()
    return int(array.__cuda_array_interface__["shape"][0])


def _check_count(name, size, count, exact):
    if size < count or (exact and size != count):
        raise InvalidArgumentError("%s has %d entries; %s%d needed" %
                                   (name, size, "" if exact else ">= ",
                                    count))


def _device_int64(interface, name, count, exact):
    """The device address of a one-dimensional, contiguous int64 CUDA array
    of `count` entries (at least `count` unless `exact`)."""
    shape = tuple(interface.get("shape", ()))
    strides = interface.get("strides")
    if interface.get("typestr") != "<i8" or len(shape) != 1:
        raise InvalidArgumentError(
            "%s must be a one-dimensional int64 CUDA array, not %s of shape "
            "%s" % (name, interface.get("typestr"), shape))
    if strides is not None and tuple(strides) != (8,) and shape[0] > 1:
        raise InvalidArgumentError("%s must be contiguous (strides %s)" %
                                   (name, strides))
    _check_count(name, shape[0], count, exact)
    return interface["data"][0]


def _new_device_int64(like, count):
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(like, torch.Tensor):
        raise InvalidArgumentError(
            "out=None needs a torch last_loc (to make the CUDA output like "
            "it); pass out, an int64 CUDA array of the batch's slots")
    return torch.empty(count, dtype=torch.int64, device=like.device)


def _expansion_stream(stream, like):
    """The cudaStream_t (an int; 0: the legacy default stream) a device
    expansion runs on: `stream`, or torch's current stream for a torch
    `like`."""
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(like, torch.Tensor):
            return torch.cuda.current_stream(like.device).cuda_stream
    return _stream_handle(stream)


def _host_out(out, count):
    """`out` as a writable int64 NumPy array of >= count entries, sharing
    its memory."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(out, torch.Tensor):
        if out.device.type != "cpu":
            raise InvalidArgumentError(
                "out is a tensor on %s and last_loc host memory: pass both "
                "on the same side" % out.device)
        out = out.numpy()
    if (not isinstance(out, np.ndarray) or out.dtype != np.int64 or
            out.ndim != 1 or not out.flags.c_contiguous or
            not out.flags.writeable):
        raise InvalidArgumentError(
            "out must be a writable, contiguous, one-dimensional int64 array")
    _check_count("out", out.size, count, False)
    return out


def _whole(value, name):
    if (not isinstance(value, (int, np.integer)) or isinstance(value, bool)
            or value < 0):
        raise InvalidArgumentError("%s (%r) must be an integer >= 0" %
                                   (name, value))
    return int(value)


class Client:
    """A session with a pagealloc daemon. Thread-safe, like the C++ Client.

        with pagealloc.Client.connect("unix:///run/pagealloc/gpu0.sock",
                                      name="scheduler-tp0") as client:
            with client.alloc_decode(seq_lens, last_locs) as a:
                a.check()
                use(a.slots)       # zero-copy; valid inside the block
    """

    def __init__(self, handle):
        # Use Client.connect or Client.resume.
        self._handle = handle
        # What was released: up to this ring position of this link.
        self._released_epoch = 0
        self._released_up_to = 0
        self._closed = False
        self._release_lock = threading.Lock()
        raw = _native.PoolInfo()
        _lib.pagealloc_pool(handle, ctypes.byref(raw))
        self.pool = _pool_info(raw,
                               _lib.pagealloc_pool_semantics(handle).decode())
        self.session_id = _lib.pagealloc_session_id(handle)
        self.lease_ms = _lib.pagealloc_lease_ms(handle)
        self.uses_fast_channel = bool(_lib.pagealloc_uses_fast_channel(handle))
        # Whether the session outlives this process for its lease (ABI 1.7).
        self.resumable = (_native.HAS_RESUME and
                          bool(_lib.pagealloc_session_resumable(handle)))
        self._ring = None  # (link epoch, RingInfo)

    @property
    def ring(self):
        """The current link's mapped output ring (a new one after a
        reconnect; earlier rings stay mapped while this client lives)."""
        epoch = self.link_epoch
        if self._ring is None or self._ring[0] != epoch:
            capacity = ctypes.c_int64()
            on_device = ctypes.c_int32()
            address = _lib.pagealloc_ring(self._handle, ctypes.byref(capacity),
                                          ctypes.byref(on_device))
            self._ring = (epoch, RingInfo(address=address or 0,
                                          capacity_slots=capacity.value,
                                          on_device=bool(on_device.value)))
        return self._ring[1]

    @property
    def link_epoch(self):
        """The client's link to the daemon: 0 for the session's first, one
        more after each reconnect (ABI 1.7; 0 before)."""
        if not _native.HAS_RESUME:
            return 0
        return _lib.pagealloc_link_epoch(self._handle)

    @property
    def calls_sent_again(self):
        """Calls this client sent again, with their call ids, after the
        daemon restarted under them (ABI 1.9; 0 before). The restarted
        daemon answers each once: a call that took effect is not done
        twice."""
        if not _native.HAS_CALL_IDS:
            return 0
        return _lib.pagealloc_calls_sent_again(self._handle)

    @property
    def reconnecting(self):
        """True while the client reconnects to a restarted daemon (calls
        wait for it, up to their call_timeout)."""
        return (_native.HAS_RESUME and
                bool(_lib.pagealloc_reconnecting(self._handle)))

    @staticmethod
    def _options(target, name, ring_capacity_slots, quota_pages,
                 keepalive_interval, call_timeout, fast_channel,
                 fast_channel_spin, register_secret, map_kv_slab, resumable,
                 reconnect_timeout, reconnect_backoff):
        options = _native.ClientOptions()
        _lib.pagealloc_client_options_init(ctypes.byref(options),
                                           ctypes.sizeof(options))
        options.target = str(target).encode() if target is not None else b""
        options.client_name = str(name).encode()
        options.ring_capacity_slots = int(ring_capacity_slots)
        options.quota_pages = int(quota_pages)
        options.keepalive_interval_ms = _seconds_to_ms(keepalive_interval,
                                                       "keepalive_interval")
        options.call_timeout_ms = _seconds_to_ms(call_timeout, "call_timeout")
        options.fast_channel = 1 if fast_channel else 0
        options.fast_channel_spin_us = int(round(fast_channel_spin * 1e6))
        if register_secret is not None:
            secret = (register_secret.encode()
                      if isinstance(register_secret, str)
                      else bytes(register_secret))
            options.register_secret = secret
            options.register_secret_length = len(secret)
        options.map_kv_slab = 1 if map_kv_slab else 0
        wants_restarts = (resumable or reconnect_timeout is not None or
                          reconnect_backoff is not None)
        if wants_restarts and not _native.HAS_RESUME:
            raise FailedPreconditionError(
                "%s cannot resume sessions or reconnect (ABI 1.7 needed)" %
                _native.path)
        if resumable:
            options.resumable = 1
        if reconnect_timeout is not None:
            options.reconnect_timeout_ms = _seconds_to_ms(reconnect_timeout,
                                                          "reconnect_timeout")
        if reconnect_backoff is not None:
            initial, largest = reconnect_backoff
            options.reconnect_initial_backoff_ms = _seconds_to_ms(
                initial, "reconnect_backoff[0]")
            options.reconnect_max_backoff_ms = _seconds_to_ms(
                largest, "reconnect_backoff[1]")
        return options

    @classmethod
    def connect(cls, target=None, *, name="", ring_capacity_slots=0,
                quota_pages=0, keepalive_interval=None, call_timeout=30.0,
                fast_channel=True, fast_channel_spin=500e-6,
                register_secret=None, map_kv_slab=True, resumable=False,
                reconnect_timeout=None, reconnect_backoff=None):
        """Connects to the daemon at `target` ("unix:///path.sock" or
        "host:port"; None: GPU 0's daemon where pagealloc-server listens
        by default, /run/pagealloc/gpu0.sock, else
        $XDG_RUNTIME_DIR/pagealloc/gpu0.sock), registers a session, maps its output ring (and the
        pool's KV slab, when the daemon owns the KV memory) and keeps its
        lease from a background thread.

        keepalive_interval, call_timeout and fast_channel_spin are seconds
        (keepalive_interval None: a third of the daemon's lease).
        register_secret (str or bytes) is the pool's secret when its daemon
        runs with --register_secret_file. map_kv_slab=False does without
        the KV slab (kv_buffers() is then empty). resumable=True keeps the
        session, when this process dies or detach() lets go, until its
        lease runs out, for Client.resume from another process.
        reconnect_timeout (seconds; None: for the daemon's lease when the
        daemon keeps its state across restarts, else off; 0: off) is how
        long a client whose daemon died tries to resume its session from
        the restarted daemon, waiting reconnect_backoff = (initial,
        largest) seconds between attempts, doubling (default (0.05, 1.0));
        docs/python.md, "Restarts". Raises
        UnavailableError when nothing listens at the target (without one:
        when no socket is at either path, naming both),
        UnauthenticatedError when the daemon's memory socket refuses the
        session, FailedPreconditionError when a CPU daemon's ring cannot be
        mapped (another host).
        """
        options = cls._options(target, name, ring_capacity_slots,
                               quota_pages, keepalive_interval, call_timeout,
                               fast_channel, fast_channel_spin,
                               register_secret, map_kv_slab, resumable,
                               reconnect_timeout, reconnect_backoff)
        handle = ctypes.c_void_p()
        error = _error_buffer()
        _check(_lib.pagealloc_connect(ctypes.byref(options),
                                      ctypes.byref(handle),
                                      ctypes.byref(error)), error)
        return cls(handle.value)

    @classmethod
    def resume(cls, target, session_id, session_token, *, take_over=False,
               ring_capacity_slots=0, keepalive_interval=None,
               call_timeout=30.0, fast_channel=True, fast_channel_spin=500e-6,
               register_secret=None, map_kv_slab=True,
               reconnect_timeout=None, reconnect_backoff=None):
        """Takes back the live session `session_id` (its `session_token`,
        bytes) at `target` instead of registering one: a scheduler
        restarted within its lease, a tool acting for a session. The
        session keeps its pages, checkpoints and quota; its output ring
        and fast channel are new. Other arguments as in connect (the
        session's name, quota and resumable flag are its own). Raises
        NotFoundError (unknown, expired, or reclaimed: a session that was
        not resumable went with its process), UnauthenticatedError (token,
        register secret), FailedPreconditionError while another process
        holds the session, unless take_over=True (that process is then
        told its session was taken)."""
        options = cls._options(target, "", ring_capacity_slots, 0,
                               keepalive_interval, call_timeout, fast_channel,
                               fast_channel_spin, register_secret,
                               map_kv_slab, False, reconnect_timeout,
                               reconnect_backoff)
        if not _native.HAS_RESUME:
            raise FailedPreconditionError(
                "%s cannot resume sessions (ABI 1.7 needed)" % _native.path)
        token = bytes(session_token)
        handle = ctypes.c_void_p()
        error = _error_buffer()
        _check(_lib.pagealloc_resume(ctypes.byref(options), int(session_id),
                                     token, len(token),
                                     1 if take_over else 0,
                                     ctypes.byref(handle),
                                     ctypes.byref(error)), error)
        return cls(handle.value)

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and _lib is not None:
            for box in self.__dict__.get("_reserve_boxes", ()):
                _destroy_reserve(box)
            _lib.pagealloc_client_destroy(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        """Ends the session now: when it returns the daemon has freed its
        pages. Later calls raise FailedPreconditionError. Views of its
        allocations stay mapped (not updated) until they are gone. Closing
        twice is fine."""
        error = _error_buffer()
        _check(_lib.pagealloc_close(self._handle, ctypes.byref(error)), error)
        self._closed = True

    def detach(self):
        """Lets go of a resumable session without ending it: the daemon
        keeps it, pages and all, until its lease runs out, for
        Client.resume from another process. Later calls raise
        FailedPreconditionError; FailedPreconditionError too for a session
        that is not resumable (close it instead) or is gone."""
        if not _native.HAS_RESUME:
            raise FailedPreconditionError(
                "%s cannot detach sessions (ABI 1.7 needed)" % _native.path)
        error = _error_buffer()
        _check(_lib.pagealloc_detach(self._handle, ctypes.byref(error)), error)
        self._closed = True

    # ---------------------------------------------------------------- calls

    @staticmethod
    def _call_options(return_inline, async_completion, free_pages_first,
                      checkpoint_first, all_or_nothing, keep):
        if free_pages_first is None:
            return _call_options_ref(return_inline, async_completion,
                                     checkpoint_first, all_or_nothing)
        options = _native.CallOptions()
        _lib.pagealloc_call_options_init(ctypes.byref(options),
                                         ctypes.sizeof(options))
        options.return_inline = 1 if return_inline else 0
        options.async_completion = 1 if async_completion else 0
        options.checkpoint_first = 1 if checkpoint_first else 0
        options.all_or_nothing = 1 if all_or_nothing else 0
        if free_pages_first is not None:
            pages = _int64_array(free_pages_first, "free_pages_first")
            keep.append(pages)
            options.free_pages_first = _address(pages)
            options.num_free_pages_first = pages.size
        return ctypes.byref(options)

    # The allocation calls on prepared arguments: host addresses of int64
    # arrays (kept alive by the caller for the call) with their lengths, and
    # `options` from _call_options (a reference or None). The public calls
    # below and pagealloc.sglang's allocators go through these. The handle
    # is passed as the c_void_p itself: ctypes passes its address for the
    # POINTER(c_void_p) parameter.

    def _alloc_extend_at(self, prefix, num_prefix, seq, num_seq, last,
                         num_last, options, inline=False):
        context = _call_context()
        handle = ctypes.c_void_p()
        code = _alloc_extend_c(self._handle, prefix, num_prefix, seq,
                               num_seq, last, num_last, options,
                               handle, context.error_ref)
        if code:
            _raise(code, context.error)
        return Allocation(self, handle.value, inline)

    def _alloc_decode_at(self, seq, num_seq, last, num_last, options,
                         inline=False):
        context = _call_context()
        handle = ctypes.c_void_p()
        code = _alloc_decode_c(self._handle, seq, num_seq, last, num_last,
                               options, handle, context.error_ref)
        if code:
            _raise(code, context.error)
        return Allocation(self, handle.value, inline)

    def _alloc_at(self, tokens, num_tokens, options, inline=False):
        context = _call_context()
        handle = ctypes.c_void_p()
        code = _alloc_c(self._handle, tokens, num_tokens, options,
                        handle, context.error_ref)
        if code:
            _raise(code, context.error)
        return Allocation(self, handle.value, inline)

    def _order_after_at(self, allocation, stream_handle):
        """order_after for one of this client's allocations and a
        cudaStream_t as an int (0: the legacy default stream)."""
        context = _call_context()
        code = _order_after_c(self._handle, allocation._handle,
                              stream_handle or None, context.error_ref)
        if code:
            _raise(code, context.error)

    def alloc_extend(self, prefix_lens, seq_lens, last_locs, *,
                     return_inline=False, async_completion=False,
                     free_pages_first=None, checkpoint_first=False,
                     all_or_nothing=False):
        """Extends each request from prefix_lens[i] to seq_lens[i] tokens;
        last_locs[i] is the slot of its last prefix token (-1 for an empty
        prefix). Returns an Allocation; raises for a bad call (e.g.
        InvalidArgumentError naming the field and index).

        all_or_nothing=True admits every request or none: when one does not
        fit, each is refused with RESOURCE_EXHAUSTED and the pool is left
        as it was (SGLang's None); the call itself does not raise."""
        keep = []
        prefix = _int64_array(prefix_lens, "prefix_lens")
        seq = _int64_array(seq_lens, "seq_lens")
        last = _int64_array(last_locs, "last_locs")
        options = self._call_options(return_inline, async_completion,
                                     free_pages_first, checkpoint_first,
                                     all_or_nothing, keep)
        return self._alloc_extend_at(
            prefix.ctypes.data, prefix.size, seq.ctypes.data, seq.size,
            last.ctypes.data, last.size, options, bool(return_inline))

    def alloc_decode(self, seq_lens, last_locs, *, return_inline=False,
                     async_completion=False, free_pages_first=None,
                     checkpoint_first=False, all_or_nothing=False):
        """One token per request: seq_lens[i] is the length with the new
        token, last_locs[i] the slot of the token before it."""
        keep = []
        seq = _int64_array(seq_lens, "seq_lens")
        last = _int64_array(last_locs, "last_locs")
        options = self._call_options(return_inline, async_completion,
                                     free_pages_first, checkpoint_first,
                                     all_or_nothing, keep)
        return self._alloc_decode_at(seq.ctypes.data, seq.size,
                                     last.ctypes.data, last.size, options,
                                     bool(return_inline))

    def alloc(self, num_tokens, *, return_inline=False,
              async_completion=False, free_pages_first=None,
              checkpoint_first=False, all_or_nothing=False):
        """Whole pages: num_tokens[i] tokens, a multiple of the page size."""
        keep = []
        tokens = _int64_array(num_tokens, "num_tokens")
        options = self._call_options(return_inline, async_completion,
                                     free_pages_first, checkpoint_first,
                                     all_or_nothing, keep)
        return self._alloc_at(tokens.ctypes.data, tokens.size, options,
                              bool(return_inline))

    def release(self, allocation):
        """Lets the daemon reuse the ring space of `allocation` and of every
        allocation before it; sent with the next allocation call, or now by
        flush_release(). Views of those allocations may show other slots
        from then on."""
        if allocation._client is not self:
            raise InvalidArgumentError("the allocation is another client's")
        _release_c(self._handle, allocation._handle)
        with self._release_lock:
            # A later link's release releases everything before it; an
            # earlier link's allocation has nothing left to release.
            if allocation.link_epoch > self._released_epoch:
                self._released_epoch = allocation.link_epoch
                self._released_up_to = allocation.ring_end
            elif allocation.link_epoch == self._released_epoch:
                self._released_up_to = max(self._released_up_to,
                                           allocation.ring_end)

    def _is_released(self, allocation):
        with self._release_lock:
            return (allocation.link_epoch < self._released_epoch or
                    (allocation.link_epoch == self._released_epoch and
                     allocation.ring_end <= self._released_up_to))

    def flush_release(self):
        """Sends the release now instead of with the next allocation call."""
        error = _error_buffer()
        _check(_lib.pagealloc_flush_release(self._handle, ctypes.byref(error)),
               error)

    def free(self, slots, stream=None, *, order=None):
        """Frees the distinct pages of `slots`; returns the pages freed. All
        or nothing: FailedPreconditionError for a double free,
        PermissionDeniedError for another session's page,
        InvalidArgumentError for page 0 or one out of range.

        `order` is where the pages go back in the free list: None (the
        pool's default: "ascending" under --semantics=sglang with a page
        size above 1, "first_appearance" otherwise), "ascending" (SGLang's
        free) or "first_appearance" (SGLang's free_segment). `stream`: as
        free_pages' (the release fence)."""
        return self._free_at(slots, "slots", stream, order)

    def free_pages(self, pages, stream=None, *, order=None):
        """Frees page ids; returns the pages freed (as free(); the pool's
        default order for page ids is first appearance).

        With a `stream` (a torch.cuda.Stream, a CuPy stream, or a
        cudaStream_t as an int, 0 being the legacy default stream) the free
        is fenced on it (docs/design.md, "The release fence"): the pages
        stay the session's until the work queued on the stream before this
        call is done, with no host synchronisation. None: freed as the host
        calls it (right after a host sync, and on the CPU backend).
        FailedPreconditionError for a stream on a session without a fast
        channel."""
        return self._free_at(pages, "pages", stream, order)

    def _free_at(self, values, name, stream, order):
        array = _int64_array(values, name)
        code = _free_order(order)
        freed = ctypes.c_int64()
        error = _error_buffer()
        if stream is None:
            function = (_lib.pagealloc_free_pages_in_order if name == "pages"
                        else _lib.pagealloc_free_slots_in_order)
            _check(function(self._handle, _address(array), array.size, code,
                            ctypes.byref(freed), ctypes.byref(error)), error)
        else:
            function = (_lib.pagealloc_free_pages_on_stream
                        if name == "pages"
                        else _lib.pagealloc_free_slots_on_stream)
            _check(function(self._handle, _address(array), array.size, code,
                            _stream_handle(stream) or None,
                            ctypes.byref(freed), ctypes.byref(error)), error)
        return freed.value

    def queue_release(self, stream=None):
        """Queues on `stream` (as free_pages'; None: the legacy default
        stream) the write of the session's next release value behind the
        work queued there and returns the value (docs/design.md, "The
        release fence"). On the CPU backend the value is written at once."""
        value = ctypes.c_uint64()
        error = _error_buffer()
        _check(_lib.pagealloc_queue_release(
            self._handle, _stream_handle(stream) or None,
            ctypes.byref(value), ctypes.byref(error)), error)
        return value.value

    def free_pages_after(self, pages, release_value, *, order=None):
        """Frees page ids that stay the session's until its release word
        reaches `release_value` (a value queue_release returned); 0 is an
        ordinary free."""
        array = _int64_array(pages, "pages")
        code = _free_order(order)
        freed = ctypes.c_int64()
        error = _error_buffer()
        _check(_lib.pagealloc_free_pages_after(
            self._handle, _address(array), array.size, code,
            _whole(release_value, "release_value"), ctypes.byref(freed),
            ctypes.byref(error)), error)
        return freed.value

    # ---- Shared prefix pages (docs/python.md, "Shared prefix pages").

    def publish(self, pages, keys, *, parent_key=None, pin=False):
        """Publishes pages this session owns under `keys` (bytes of 32 each,
        one per page, in chain order: keys[0]'s parent is `parent_key`,
        None at a chain's start). Call it only once the GPU work that
        writes the pages' KV is done (synchronize that stream first), and
        only for whole pages. The session keeps one reference on each
        (free_pages drops it). Returns (pages, existing): the page each key
        is published under now, and for each whether the key was there
        already (then the page is the existing one and the caller's page
        stays its own, to free). All or nothing."""
        array = _int64_array(pages, "pages")
        chain, count = _key_chain(keys)
        if count != array.size:
            raise InvalidArgumentError(
                "%d pages and %d keys: one key per page" % (array.size, count))
        parent = None
        if parent_key is not None:
            parent, _ = _key_chain([parent_key], "parent_key")
        published = np.zeros(array.size, dtype=np.int64)
        existing = np.zeros(array.size, dtype=np.uint8)
        newly = ctypes.c_int64()
        error = _error_buffer()
        _check(_lib.pagealloc_publish(
            self._handle, _address(array), _address(chain), count,
            _address(parent) if parent is not None else None,
            1 if pin else 0, _address(published), _address(existing),
            ctypes.byref(newly), ctypes.byref(error)), error)
        return published, existing.astype(bool)

    def match_prefix(self, keys, adopt=True):
        """The pages of the longest prefix of the chain `keys` (bytes of 32
        each) that is published or cached, as an int64 array; with
        adopt=True the session takes a reference on each in the same step
        (free_pages drops them)."""
        chain, count = _key_chain(keys)
        pages = np.zeros(count, dtype=np.int64)
        matched = ctypes.c_int64()
        error = _error_buffer()
        _check(_lib.pagealloc_match_prefix(
            self._handle, _address(chain), count, 1 if adopt else 0,
            _address(pages), ctypes.byref(matched), ctypes.byref(error)),
            error)
        return pages[:matched.value]

    def unpin_prefix(self, pages) -> int:
        """Removes this session's pins from `pages`; returns how many."""
        array = _int64_array(pages, "pages")
        unpinned = ctypes.c_int64()
        error = _error_buffer()
        _check(_lib.pagealloc_unpin_prefix(
            self._handle, _address(array), array.size, ctypes.byref(unpinned),
            ctypes.byref(error)), error)
        return unpinned.value

    def reserve(self, *, initial_batch=None, max_pages=None, tick=None,
                idle_ticks=None, starved_wait=None):
        """A PageReserve of this session: whole pages held in this process
        (docs/python.md, "Page reserves"). Times are in seconds; None keeps
        the library's default."""
        return PageReserve(self, initial_batch=initial_batch,
                           max_pages=max_pages, tick=tick,
                           idle_ticks=idle_ticks, starved_wait=starved_wait)

    def free_group(self, order=None):
        """A FreeGroup: `with client.free_group() as g: g.add(slots) ...`;
        its one free uses `order` (as free())."""
        _free_order(order)
        return FreeGroup(self, order)

    def checkpoint(self) -> int:
        """Pushes a checkpoint on the session's stack (at most 64; a 65th
        ends the oldest) and returns its id (never 0): the pages the session
        is given from now on are recorded, for rollback(id)."""
        checkpoint_id = ctypes.c_uint64()
        error = _error_buffer()
        _check(_lib.pagealloc_checkpoint_id(self._handle,
                                            ctypes.byref(checkpoint_id),
                                            ctypes.byref(error)), error)
        return checkpoint_id.value

    def rollback(self, checkpoint_id=None) -> int:
        """Returns the pages given since a checkpoint that the session still
        owns to the front of the free list; returns how many.

        Without an id: to the latest checkpoint, which ends. With one: to
        that checkpoint; the later ones end and it stays, so it can be
        rolled back to again (SGLang's restore_state). Pages freed since
        stay freed. FailedPreconditionError without a checkpoint, or when
        `checkpoint_id` has ended (a rollback to an earlier one, a clear,
        or pushed out of the stack)."""
        if checkpoint_id is None:
            checkpoint_id = 0
        elif (not isinstance(checkpoint_id, (int, np.integer)) or
              isinstance(checkpoint_id, bool) or checkpoint_id <= 0):
            raise InvalidArgumentError(
                "checkpoint_id must be an id checkpoint() returned, not %r" %
                (checkpoint_id,))
        returned = ctypes.c_int64()
        error = _error_buffer()
        _check(_lib.pagealloc_rollback_to(self._handle, int(checkpoint_id),
                                          ctypes.byref(returned),
                                          ctypes.byref(error)), error)
        return returned.value

    def clear_session(self) -> int:
        """Frees every page of this session and ends its checkpoints; the
        session stays. When no page of the pool is owned afterwards the
        free list is reset to 1..num_pages and nothing stays parked
        (SGLang's clear). Returns the pages freed."""
        freed = ctypes.c_int64()
        error = _error_buffer()
        _check(_lib.pagealloc_clear_session(self._handle, ctypes.byref(freed),
                                            ctypes.byref(error)), error)
        return freed.value

    def list_pages(self):
        """The pages this session owns as the daemon has them, ascending,
        as an int64 NumPy array (shared prefix pages it holds references
        on are not listed), in order with its earlier calls: what a caller
        reconciles with after a call the daemon could not answer across its
        restart (ABI 1.9)."""
        if not _native.HAS_CALL_IDS:
            raise FailedPreconditionError(
                "list_pages needs the library's ABI 1.9")
        count = ctypes.c_size_t()
        while True:
            pages = np.zeros(max(count.value, 1), dtype=np.int64)
            error = _error_buffer()
            code = _lib.pagealloc_list_pages(
                self._handle, pages.ctypes.data, pages.size,
                ctypes.byref(count), ctypes.byref(error))
            # More pages than room: the count says how many, try again.
            if code == StatusCode.OUT_OF_RANGE and count.value > pages.size:
                continue
            _check(code, error)
            return pages[:count.value]

    def free_lists(self, max_pages=4096):
        """A debug read of the pool's free lists: (free_pages,
        parked_pages), int64 NumPy arrays of at most `max_pages` entries
        each (the front of the free list in the order it hands pages out;
        the pages parked under the sorted policy, in the order they were
        freed). The result is a FreeLists, a tuple that also carries
        `free_count` and `parked_count` (the lists' whole lengths). A call
        of its own to the daemon: it needs no live session."""
        lists = _new_free_lists(max_pages)
        error = _error_buffer()
        _check(_lib.pagealloc_get_free_lists(self._handle,
                                             ctypes.byref(lists[0]),
                                             ctypes.byref(error)), error)
        return _free_lists_result(*lists)

    def stats(self):
        """The daemon's pool figures."""
        raw = _native.Stats()
        raw.struct_size = ctypes.sizeof(raw)
        error = _error_buffer()
        _check(_lib.pagealloc_get_stats(self._handle, ctypes.byref(raw),
                                        ctypes.byref(error)), error)
        return Stats(pool=_pool_info(raw.pool, raw.semantics.decode()),
                     free_pages=raw.free_pages,
                     parked_pages=raw.parked_pages, used_pages=raw.used_pages,
                     slots_allocated_total=raw.slots_allocated_total,
                     pages_allocated_total=raw.pages_allocated_total,
                     pages_freed_total=raw.pages_freed_total,
                     out_of_pages_total=raw.out_of_pages_total,
                     free_list_sorts_total=raw.free_list_sorts_total,
                     launches_total=raw.launches_total,
                     sessions_active=raw.sessions_active,
                     prefix_published_pages=raw.prefix_published_pages,
                     prefix_cached_pages=raw.prefix_cached_pages,
                     prefix_pinned_pages=raw.prefix_pinned_pages,
                     prefix_evictable_pages=raw.prefix_evictable_pages,
                     prefix_lookup_pages_total=raw.prefix_lookup_pages_total,
                     prefix_hit_pages_total=raw.prefix_hit_pages_total)

    def session_status(self) -> Optional[PageallocError]:
        """None while the session lives; else why it is gone, as an
        exception object (not raised): FailedPreconditionError once closed,
        NotFoundError / UnavailableError when the lease was lost or the
        daemon went away (the session's slots are void)."""
        error = _error_buffer()
        code = _lib.pagealloc_session_status(self._handle, ctypes.byref(error))
        if code == 0:
            return None
        return error_for(code, error.message.decode("utf-8", "replace"))

    @property
    def alive(self):
        return self.session_status() is None

    @property
    def session_token(self):
        """The session's secret (bytes); hand it only to tools acting for
        this session."""
        length = ctypes.c_size_t()
        address = _lib.pagealloc_session_token(self._handle,
                                               ctypes.byref(length))
        return ctypes.string_at(address, length.value)

    @property
    def slots_on_device(self):
        """True when ring slots are GPU memory (CUDA backend)."""
        return self.ring.on_device

    def order_after_completion(self, stream=None):
        """Makes a CUDA stream wait, on the GPU (no host synchronisation),
        until the daemon's launches so far have written their slots: call it
        before a stream uses the slots of an async_completion call.
        `stream`: a torch.cuda.Stream, a CuPy stream, a cudaStream_t as an
        int, or None (the legacy default stream). A no-op on the CPU
        backend."""
        handle = _stream_handle(stream)
        error = _error_buffer()
        _check(_lib.pagealloc_order_after_completion(
            self._handle, handle or None, ctypes.byref(error)), error)

    def order_after(self, allocation, stream=None):
        """Makes a CUDA stream wait, on the GPU (no host synchronisation),
        until the launch that wrote `allocation`'s slots is done (the pool's
        completion counter reaching allocation.completion_value): what a
        consumer of an async_completion call runs before its kernels read
        the slots. `stream` as in order_after_completion. A no-op on the
        CPU backend and for inline results."""
        if not isinstance(allocation, Allocation):
            raise InvalidArgumentError(
                "allocation must be an Allocation, not %s" %
                type(allocation).__name__)
        if allocation._client is not self:
            raise InvalidArgumentError("the allocation is another client's")
        self._order_after_at(allocation, _stream_handle(stream))

    # ----------------------------------------------------------- KV buffers

    def kv_buffers(self):
        """The pool's KV buffers, mapped in this process (a list of
        KvBuffer, the layout's order): empty when the daemon hands out slot
        indices only (no --kv_layout) or map_kv_slab was off. Each is a
        zero-copy [num_slots, *element_shape] array of the slab every
        session shares; it keeps this client alive."""
        return [KvBuffer(self, i)
                for i in range(_lib.pagealloc_kv_buffer_count(self._handle))]

    def kv_buffer(self, name):
        """The KV buffer named `name` ("k.0", "v.0", "kv.3", a custom
        layout's name); KeyError when there is none."""
        index = _lib.pagealloc_kv_buffer_find(self._handle, str(name).encode())
        if index < 0:
            names = [b.name for b in self.kv_buffers()]
            raise KeyError("no KV buffer %r (this pool has %s)" %
                           (name, ", ".join(names[:8]) +
                            (", ..." if len(names) > 8 else "")
                            if names else "none"))
        return KvBuffer(self, index)

    def copy_to_host(self, slots):
        """A host copy of slots from one of this client's allocations
        (CudaSlots or a NumPy view)."""
        if isinstance(slots, CudaSlots):
            return slots.copy_to_host()
        return np.array(slots, dtype=np.int64, copy=True)

    def _copy_to_host(self, address, count):
        out = np.empty(count, dtype=np.int64)
        if count:
            error = _error_buffer()
            _check(_lib.pagealloc_copy_to_host(self._handle, address, count,
                                               _address(out),
                                               ctypes.byref(error)), error)
        return out

    def __repr__(self):
        return "Client(session_id=%d, pool=%s)" % (self.session_id, self.pool)
