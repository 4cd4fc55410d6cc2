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
from pagealloc.errors import (InvalidArgumentError, PageallocError,
                              StatusCode, error_for)

_lib = _native.lib
_tls = threading.local()


def _error_buffer():
    """This thread's pagealloc_error (one per thread, reused by every call)."""
    try:
        return _tls.error
    except AttributeError:
        _tls.error = _native.Error()
        return _tls.error


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
    return array.__array_interface__["data"][0]


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


def _pool_info(raw):
    return PoolInfo(page_size=raw.page_size, num_pages=raw.num_pages,
                    backend=_BACKENDS.get(raw.backend, str(raw.backend)),
                    gpu=raw.gpu, device_uuid=raw.device_uuid.decode(),
                    free_policy=raw.free_policy.decode())


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
        view = _lib.pagealloc_allocation_get_view(handle).contents
        self._view = view
        self.num_requests = view.num_requests
        self.num_refused = view.num_refused
        self.ring_end = view.ring_end
        self.pages_freed_first = view.pages_freed_first
        self.batch_requests = view.batch_requests
        self.on_device = bool(view.on_device)
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
        return (not self._inline and
                self.ring_end <= self._client._released_up_to)

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

    def __init__(self, client):
        self._client = client
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
            self.pages_freed = self._client.free(np.concatenate(parts))
        return self.pages_freed

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        if exc_type is None:
            self.end()
        return False


def _seconds_to_ms(value, name):
    if value is None:
        return 0
    ms = int(round(value * 1000))
    if ms < 0:
        raise InvalidArgumentError("%s (%r s) is negative" % (name, value))
    return ms


class Client:
    """A session with a pagealloc daemon. Thread-safe, like the C++ Client.

        with pagealloc.Client.connect("unix:///run/pagealloc/gpu0.sock",
                                      name="scheduler-tp0") as client:
            with client.alloc_decode(seq_lens, last_locs) as a:
                a.check()
                use(a.slots)       # zero-copy; valid inside the block
    """

    def __init__(self, handle):
        # Use Client.connect.
        self._handle = handle
        self._released_up_to = 0
        self._closed = False
        self._release_lock = threading.Lock()
        raw = _native.PoolInfo()
        _lib.pagealloc_pool(handle, ctypes.byref(raw))
        self.pool = _pool_info(raw)
        self.session_id = _lib.pagealloc_session_id(handle)
        self.lease_ms = _lib.pagealloc_lease_ms(handle)
        self.uses_fast_channel = bool(_lib.pagealloc_uses_fast_channel(handle))
        capacity = ctypes.c_int64()
        on_device = ctypes.c_int32()
        address = _lib.pagealloc_ring(handle, ctypes.byref(capacity),
                                      ctypes.byref(on_device))
        self.ring = RingInfo(address=address or 0,
                             capacity_slots=capacity.value,
                             on_device=bool(on_device.value))

    @classmethod
    def connect(cls, target, *, name="", ring_capacity_slots=0,
                quota_pages=0, keepalive_interval=None, call_timeout=30.0,
                fast_channel=True, fast_channel_spin=500e-6):
        """Connects to the daemon at `target` ("unix:///path.sock" or
        "host:port"), registers a session, maps its output ring and keeps
        its lease from a background thread.

        keepalive_interval, call_timeout and fast_channel_spin are seconds
        (keepalive_interval None: a third of the daemon's lease). Raises
        UnavailableError when nothing listens at the target,
        UnauthenticatedError when the daemon's memory socket refuses the
        session, FailedPreconditionError when a CPU daemon's ring cannot be
        mapped (another host).
        """
        options = _native.ClientOptions()
        _lib.pagealloc_client_options_init(ctypes.byref(options),
                                           ctypes.sizeof(options))
        options.target = str(target).encode()
        options.client_name = str(name).encode()
        options.ring_capacity_slots = int(ring_capacity_slots)
        options.quota_pages = int(quota_pages)
        options.keepalive_interval_ms = _seconds_to_ms(keepalive_interval,
                                                       "keepalive_interval")
        options.call_timeout_ms = _seconds_to_ms(call_timeout, "call_timeout")
        options.fast_channel = 1 if fast_channel else 0
        options.fast_channel_spin_us = int(round(fast_channel_spin * 1e6))
        handle = ctypes.c_void_p()
        error = _error_buffer()
        _check(_lib.pagealloc_connect(ctypes.byref(options),
                                      ctypes.byref(handle),
                                      ctypes.byref(error)), error)
        return cls(handle.value)

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and _lib is not None:
            _lib.pagealloc_client_destroy(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        """Ends the session now: the daemon frees its pages. Later calls
        raise FailedPreconditionError. Views of its allocations stay
        mapped (not updated) until they are gone. Closing twice is fine."""
        error = _error_buffer()
        _check(_lib.pagealloc_close(self._handle, ctypes.byref(error)), error)
        self._closed = True

    # ---------------------------------------------------------------- calls

    @staticmethod
    def _call_options(return_inline, async_completion, free_pages_first,
                      checkpoint_first, keep):
        if not (return_inline or async_completion or checkpoint_first or
                free_pages_first is not None):
            return None
        options = _native.CallOptions()
        _lib.pagealloc_call_options_init(ctypes.byref(options),
                                         ctypes.sizeof(options))
        options.return_inline = 1 if return_inline else 0
        options.async_completion = 1 if async_completion else 0
        options.checkpoint_first = 1 if checkpoint_first else 0
        if free_pages_first is not None:
            pages = _int64_array(free_pages_first, "free_pages_first")
            keep.append(pages)
            options.free_pages_first = _address(pages)
            options.num_free_pages_first = pages.size
        return ctypes.byref(options)

    def _finish(self, code, handle, error, return_inline):
        _check(code, error)
        return Allocation(self, handle.value, bool(return_inline))

    def alloc_extend(self, prefix_lens, seq_lens, last_locs, *,
                     return_inline=False, async_completion=False,
                     free_pages_first=None, checkpoint_first=False):
        """Extends each request from prefix_lens[i] to seq_lens[i] tokens;
        last_locs[i] is the slot of its last prefix token (-1 for an empty
        prefix). Returns an Allocation; raises for a bad call (e.g.
        InvalidArgumentError naming the field and index)."""
        keep = []
        prefix = _int64_array(prefix_lens, "prefix_lens")
        seq = _int64_array(seq_lens, "seq_lens")
        last = _int64_array(last_locs, "last_locs")
        options = self._call_options(return_inline, async_completion,
                                     free_pages_first, checkpoint_first, keep)
        handle = ctypes.c_void_p()
        error = _error_buffer()
        code = _lib.pagealloc_alloc_extend(
            self._handle, _address(prefix), prefix.size, _address(seq),
            seq.size, _address(last), last.size, options,
            ctypes.byref(handle), ctypes.byref(error))
        return self._finish(code, handle, error, return_inline)

    def alloc_decode(self, seq_lens, last_locs, *, return_inline=False,
                     async_completion=False, free_pages_first=None,
                     checkpoint_first=False):
        """One token per request: seq_lens[i] is the length with the new
        token, last_locs[i] the slot of the token before it."""
        keep = []
        seq = _int64_array(seq_lens, "seq_lens")
        last = _int64_array(last_locs, "last_locs")
        options = self._call_options(return_inline, async_completion,
                                     free_pages_first, checkpoint_first, keep)
        handle = ctypes.c_void_p()
        error = _error_buffer()
        code = _lib.pagealloc_alloc_decode(
            self._handle, _address(seq), seq.size, _address(last), last.size,
            options, ctypes.byref(handle), ctypes.byref(error))
        return self._finish(code, handle, error, return_inline)

    def alloc(self, num_tokens, *, return_inline=False,
              async_completion=False, free_pages_first=None,
              checkpoint_first=False):
        """Whole pages: num_tokens[i] tokens, a multiple of the page size."""
        keep = []
        tokens = _int64_array(num_tokens, "num_tokens")
        options = self._call_options(return_inline, async_completion,
                                     free_pages_first, checkpoint_first, keep)
        handle = ctypes.c_void_p()
        error = _error_buffer()
        code = _lib.pagealloc_alloc(
            self._handle, _address(tokens), tokens.size, options,
            ctypes.byref(handle), ctypes.byref(error))
        return self._finish(code, handle, error, return_inline)

    def release(self, allocation):
        """Lets the daemon reuse the ring space of `allocation` and of every
        allocation before it; sent with the next allocation call, or now by
        flush_release(). Views of those allocations may show other slots
        from then on."""
        if allocation._client is not self:
            raise InvalidArgumentError("the allocation is another client's")
        _lib.pagealloc_release(self._handle, allocation._handle)
        with self._release_lock:
            self._released_up_to = max(self._released_up_to,
                                       allocation.ring_end)

    def flush_release(self):
        """Sends the release now instead of with the next allocation call."""
        error = _error_buffer()
        _check(_lib.pagealloc_flush_release(self._handle, ctypes.byref(error)),
               error)

    def free(self, slots):
        """Frees the distinct pages of `slots`; returns the pages freed. All
        or nothing: FailedPreconditionError for a double free,
        PermissionDeniedError for another session's page,
        InvalidArgumentError for page 0 or one out of range."""
        array = _int64_array(slots, "slots")
        freed = ctypes.c_int64()
        error = _error_buffer()
        _check(_lib.pagealloc_free_slots(self._handle, _address(array),
                                         array.size, ctypes.byref(freed),
                                         ctypes.byref(error)), error)
        return freed.value

    def free_pages(self, pages):
        """Frees page ids; returns the pages freed (as free())."""
        array = _int64_array(pages, "pages")
        freed = ctypes.c_int64()
        error = _error_buffer()
        _check(_lib.pagealloc_free_pages(self._handle, _address(array),
                                         array.size, ctypes.byref(freed),
                                         ctypes.byref(error)), error)
        return freed.value

    def free_group(self):
        """A FreeGroup: `with client.free_group() as g: g.add(slots) ...`."""
        return FreeGroup(self)

    def checkpoint(self):
        """Records the pages this session is given from now on."""
        error = _error_buffer()
        _check(_lib.pagealloc_checkpoint(self._handle, ctypes.byref(error)),
               error)

    def rollback(self):
        """Returns the pages given since the checkpoint that the session
        still owns to the front of the free list; returns how many.
        FailedPreconditionError without a checkpoint."""
        returned = ctypes.c_int64()
        error = _error_buffer()
        _check(_lib.pagealloc_rollback(self._handle, ctypes.byref(returned),
                                       ctypes.byref(error)), error)
        return returned.value

    def stats(self):
        """The daemon's pool figures."""
        raw = _native.Stats()
        raw.struct_size = ctypes.sizeof(raw)
        error = _error_buffer()
        _check(_lib.pagealloc_get_stats(self._handle, ctypes.byref(raw),
                                        ctypes.byref(error)), error)
        return Stats(pool=_pool_info(raw.pool), free_pages=raw.free_pages,
                     parked_pages=raw.parked_pages, used_pages=raw.used_pages,
                     slots_allocated_total=raw.slots_allocated_total,
                     pages_allocated_total=raw.pages_allocated_total,
                     pages_freed_total=raw.pages_freed_total,
                     out_of_pages_total=raw.out_of_pages_total,
                     free_list_sorts_total=raw.free_list_sorts_total,
                     launches_total=raw.launches_total,
                     sessions_active=raw.sessions_active)

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
        if stream is None:
            handle = 0
        elif isinstance(stream, int):
            handle = stream
        elif hasattr(stream, "cuda_stream"):   # torch.cuda.Stream
            handle = int(stream.cuda_stream)
        elif hasattr(stream, "ptr"):           # cupy.cuda.Stream
            handle = int(stream.ptr)
        else:
            raise InvalidArgumentError(
                "stream must be a torch or CuPy stream, an int handle or "
                "None, not %s" % type(stream).__name__)
        error = _error_buffer()
        _check(_lib.pagealloc_order_after_completion(
            self._handle, handle or None, ctypes.byref(error)), error)

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
