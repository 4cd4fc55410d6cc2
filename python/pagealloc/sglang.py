"""SGLang's KV-cache index allocators, served by a pagealloc daemon.

``PagedTokenToKVPoolAllocator`` (page_size > 1) and ``TokenToKVPoolAllocator``
(page_size 1) have the interface and the return conventions of SGLang's
classes of the same names (``sglang.srt.mem_cache.allocator``): the same
constructor arguments plus the daemon to use, ``None`` for a batch that does
not fit (and nothing changes), int64 slot tensors otherwise. The free list
lives in the daemon, shared with every other session of its pool; these
classes keep no list of their own beyond the session's page reserve (below).

The daemon must run with ``--semantics=sglang`` and the free policy SGLang's
``need_sort`` names (``--free_policy=sorted`` for ``need_sort=True``, else
``lifo``); the constructor refuses another pool.

The session's page reserve (``Client.reserve()``, docs/design.md section
12) serves SGLang's main path by default (``use_reserve=True``):
``alloc(need_size)`` takes whole pages from the reserve in this process and
frees of whole pages it handed out (``free``, ``free_page_ids``, free
groups) put them back, with no call to the daemon in steady state.
``alloc_extend`` / ``alloc_decode`` (SGLang's legacy path) expand on the
reserve in this process too (``PageReserve.alloc_extend``: the new pages
from the reserve, the slots written on the current stream from a CUDA
``last_loc``, which is never copied to the host); pages the reserve did
not hand out go through the daemon as before. ``use_reserve=False`` sends
every call to the daemon.

With one session on the pool and ``use_reserve=False``, the slots, the
``None``s and the free list after every call are SGLang's; on a reserve
that holds the whole pool, the slots and the ``None``s are
(docs/design.md section 10, which also says what order holds with a
smaller reserve or several sessions); docs/python.md, "The SGLang
allocator", lists where a pool shared by several processes cannot behave
as SGLang's single-process allocator, and what these classes do instead.

What comes back from the daemon's calls (a reserve's ``alloc`` returns a
NumPy array, a CPU tensor over it, or a tensor copied to the CUDA device on
the current stream from a pinned buffer, asynchronously):

* With PyTorch importable: an int64 ``torch.Tensor`` on the allocator's
  ``device``. On the daemon's CUDA backend it aliases the session's output
  ring (no copy) and the current CUDA stream is ordered after the daemon's
  kernel on the GPU (``Client.order_after``), with no host synchronisation.
  On the CPU backend it aliases the mapped ring (``device="cpu"``) or is a
  copy on ``device``.
* Without PyTorch: a read-only int64 NumPy array over the ring.

A ring region is reused once released. These classes release lazily: the
slots of a call stay as returned until ``keep_allocations`` later
allocation calls have been made *and*, on the CUDA backend, the current
stream has passed the point where the later call was made (a CUDA event
recorded at each call, queried without blocking). A scheduler that keeps a
result longer clones it (``tensor.clone()``), or builds the allocator with
``keep_allocations=0``, which clones every result on the current stream.

The inputs are read on the host: NumPy arrays and CPU tensors in place,
CUDA tensors (``last_loc``) copied on their stream into a pinned host
buffer the allocator reuses (the copy waits for that stream).
"""

import collections
import dataclasses
import os
import time
import warnings

import numpy as np

from pagealloc import _native
from pagealloc import client as _client_module
from pagealloc._reserve_head import ReserveHead
from pagealloc._reserve_mirror import ReserveMirror
from pagealloc._unread_frees import MAX_UNREAD, READ_BATCH, UnreadFrees
from pagealloc.client import Client, device_to_host_copier
from pagealloc.errors import (InvalidArgumentError, ResourceExhaustedError,
                              StatusCode)

__all__ = [
    "AllocatorState",
    "PagedTokenToKVPoolAllocator",
    "TokenToKVPoolAllocator",
    "make_allocator",
    "register_with_sglang",
]

try:  # PyTorch is optional: without it results are NumPy arrays.
    import torch
except ImportError:  # pragma: no cover - depends on the host
    torch = None

# Allocation calls whose ring slots stay untouched after they return.
DEFAULT_KEEP_ALLOCATIONS = 8
# The most slots of the reserve's top mirrored on the device by default
# (_reserve_mirror.py; mirror_pages=None: this many slots' pages): a decode
# step's alloc(need_size) is a slice of it for several steps between two
# copies.
DEFAULT_MIRROR_SLOTS = 4096

_INT64 = np.dtype(np.int64)

# The slots of the reusable pinned buffers for CUDA inputs, one per input
# of a call.
_PREFIX, _SEQ, _LAST = 0, 1, 2
# _expand_on_reserve's answer for a call the daemon serves instead.
_THIN = object()
# Entries past which the torch stream objects' cache starts afresh.
_MAX_STREAMS = 64


def _raw_stream_function():
    """A function of a CUDA device index returning the current stream's
    cudaStream_t as an int: torch's own (no Stream object is built) where
    this torch has it."""
    raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream",
                  None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream

# Free orders (Client.free's `order`): SGLang's paged free puts back the
# distinct pages ascending (torch.unique); its token allocator and its
# free_segment path put them back in the order given.
_ASCENDING = "ascending"
_IN_ORDER = "first_appearance"

# Pinned host buffers that stage reserve results for their copy to the GPU,
# used round robin: one is written again only after its copy has run.
_STAGING_DEPTH = 8


@dataclasses.dataclass(frozen=True)
class AllocatorState:
    """What ``backup_state`` returns: a checkpoint of the session, by id.

    ``restore_state`` rolls the session back to it, as often as wanted,
    while it is active (see docs/python.md for when it ends)."""
    checkpoint_id: int
    session_id: int


def _pinned_int64(count):
    """A NumPy view of `count` int64s of pinned host memory (the torch
    tensor under it stays alive with the view)."""
    return torch.empty((count,), dtype=torch.int64, pin_memory=True).numpy()


def _as_host_int64(values, name):
    """`values` (a tensor on any device, a NumPy array, a list, a ring view)
    as a new or existing contiguous int64 NumPy array on the host."""
    if torch is not None and isinstance(values, torch.Tensor):
        if (values.device.type == "cpu" and values.dtype is torch.int64 and
                not values.requires_grad):
            values = values.numpy()  # a view
        else:
            # A CUDA tensor is copied to the host here: the daemon reads
            # host memory (this synchronises with the tensor's stream).
            values = values.detach().to("cpu", torch.int64).numpy()
    elif isinstance(values, _client_module.CudaSlots):
        values = values.copy_to_host()
    array = np.ascontiguousarray(np.asarray(values).reshape(-1))
    if array.dtype != np.int64:
        if array.size and array.dtype.kind not in "iu":
            raise TypeError("%s has dtype %s; integers expected" %
                            (name, array.dtype))
        array = array.astype(np.int64)
    return array


def _connect(client, name):
    """A Client: `client` itself, a new session at the target it names, or
    one at $PAGEALLOC_TARGET when it is None, else where the daemon listens
    by default (Client.connect)."""
    if isinstance(client, Client):
        return client
    target = client if client is not None else os.environ.get(
        "PAGEALLOC_TARGET")
    return Client.connect(str(target) if target else None, name=name)


class _PinnedStaging:
    """Reserve results on their way to a CUDA device: each is written into
    a pinned host buffer and copied on the current stream, asynchronously.
    _STAGING_DEPTH buffers are used in turn, each written again only once
    the copy that read it has run (an event, queried; the host waits only
    when the GPU is that many copies behind). `current_stream`: a function
    returning the current stream's torch object, the event's stream."""

    def __init__(self, device, current_stream):
        self._device = device
        self._current_stream = current_stream
        self._buffers = [None] * _STAGING_DEPTH  # (tensor, NumPy view)
        self._events = [None] * _STAGING_DEPTH
        self._next = 0

    def copy(self, slots):
        i = self._next
        self._next = (i + 1) % _STAGING_DEPTH
        event = self._events[i]
        if event is not None and not event.query():
            event.synchronize()
        count = slots.size
        buffer = self._buffers[i]
        if buffer is None or buffer[1].size < count:
            tensor = torch.empty((max(count, 4096),), dtype=torch.int64,
                                 pin_memory=True)
            buffer = (tensor, tensor.numpy())
            self._buffers[i] = buffer
        buffer[1][:count] = slots
        out = torch.empty((count,), dtype=torch.int64, device=self._device)
        out.copy_(buffer[0][:count], non_blocking=True)
        if event is None:
            event = torch.cuda.Event()
            self._events[i] = event
        # On the current stream, looked up through the allocator's cache:
        # Event.record() with no stream builds torch's Stream object of it
        # each time, which costs more than the copy itself.
        event.record(self._current_stream())
        return out


class _Base:
    """What the token and the paged allocator share: the session, the
    results' conversion and lazy release, groups, states, lists."""

    # SGLang's capability attributes (sglang/srt/mem_cache/allocator/
    # base.py and the allocators' own): alloc(need_size) serves whole pages
    # for any multiple of page_size, the page-aligned contract its scheduler
    # plans with; alloc_extend / alloc_decode stay for the legacy path.
    uses_legacy_real_length_alloc = False
    supports_page_aligned_alloc = True
    supports_spec_page_aligned_alloc = True

    def __init__(self, size, page_size, dtype, device, kvcache, need_sort,
                 client, keep_allocations, client_name, use_reserve=True,
                 reserve_options=None, mirror_pages=None):
        self._client = _connect(client, client_name)
        pool = self._client.pool
        semantics = getattr(pool, "semantics", None)
        if semantics != "sglang":
            raise ValueError(
                "the daemon's pool runs --semantics=%s; SGLang's allocator "
                "needs a pool started with --semantics=sglang" % semantics)
        if int(page_size) != pool.page_size:
            raise ValueError("page_size %d differs from the pool's %d" %
                             (page_size, pool.page_size))
        pool_size = pool.num_pages * pool.page_size
        if size is None:
            size = pool_size
        if int(size) != pool_size:
            raise ValueError(
                "size %d differs from the pool's %d slots (%d pages of %d); "
                "start the daemon with --num_pages=%d or pass size=None" %
                (size, pool_size, pool.num_pages, pool.page_size,
                 int(size) // pool.page_size))
        sorted_policy = pool.free_policy == "sorted"
        if need_sort is None:
            need_sort = sorted_policy
        if bool(need_sort) != sorted_policy:
            raise ValueError(
                "need_sort=%s but the pool's free policy is %s; start the "
                "daemon with --free_policy=%s" %
                (need_sort, pool.free_policy,
                 "sorted" if need_sort else "lifo"))
        if int(keep_allocations) < 0:
            raise ValueError("keep_allocations (%d) is negative" %
                             keep_allocations)
        if mirror_pages is None:
            mirror_pages = DEFAULT_MIRROR_SLOTS // int(page_size)
        if int(mirror_pages) < 0:
            raise ValueError("mirror_pages (%d) is negative" % mirror_pages)

        self.size = int(size)
        self.page_size = int(page_size)
        self.dtype = dtype
        self.device = device if device is not None else (
            "cuda" if pool.backend == "cuda" else "cpu")
        self._kvcache = kvcache
        self.need_sort = bool(need_sort)
        self.num_pages = pool.num_pages
        # None outside a group; the frees held back inside one.
        self.free_group = None
        self.free_page_reps_group = []

        self._keep = int(keep_allocations)
        self._on_device = self._client.slots_on_device
        self._torch_device = None
        self._device_index = None  # the CUDA device's, None: the current
        if torch is not None:
            self._torch_device = torch.device(self.device)
            if self._on_device and self._torch_device.type != "cuda":
                raise ValueError(
                    "the daemon's slots are GPU memory (CUDA backend); "
                    "device must be a CUDA device, not %s" % self.device)
            if self._torch_device.type == "cuda":
                self._device_index = self._torch_device.index
                if (self._device_index is None and
                        torch.cuda.is_available()):
                    # "cuda" names the current device: the one this
                    # allocator's tensors are made on, now, as SGLang's
                    # are. Pinned, so that a call does not read it again
                    # (about 1 us with every stream lookup).
                    self._device_index = torch.cuda.current_device()
        # On the CUDA backend with PyTorch the current stream is ordered
        # after the daemon's kernel and an event recorded on it per call.
        self._ordered = self._on_device and torch is not None
        # Frees on the GPU are fenced on the current stream (the release
        # fence, docs/design.md): a page goes back to the pool only once the
        # work queued before its free is done, so another session's kernel
        # never writes KV this scheduler's forward still reads. It needs the
        # fast channel's release word.
        self._fenced = self._ordered and self._client.uses_fast_channel
        # Every allocation call is all-or-nothing (SGLang's None), async on
        # the GPU: its pagealloc_call_options, built once.
        self._options = _client_module._call_options_ref(
            False, self._on_device, False, True)
        self._ring_address = self._client.ring.address
        # The one-request input of alloc(n), at a fixed host address.
        self._tokens = np.zeros(1, dtype=np.int64)
        self._tokens_address = self._tokens.ctypes.data
        # Pinned host buffers for CUDA inputs, by slot: (tensor, NumPy
        # view, address) or None.
        self._pinned = [None, None, None]
        # torch stream objects by (device index, cudaStream_t): the current
        # stream is read as a raw handle each call, and its Stream object
        # (what Event.record takes) looked up here.
        self._streams = {}
        self._raw_stream = _raw_stream_function() if self._ordered else None
        # Recorded events whose allocation is released, by device index,
        # recorded again by later calls.
        self._spare_events = collections.defaultdict(list)
        # Allocations not yet released, oldest first: (allocation, event
        # or None, device index) with the event recorded on the current
        # stream when each was returned.
        self._pending = collections.deque()
        self._ring = None  # the whole ring as one tensor or array, lazily

        # The session's page reserve (None: closed, opened again by the
        # next alloc) and what this allocator did with its pages.
        self._use_reserve = bool(use_reserve)
        self._reserve_options = dict(reserve_options or {})
        # An alloc the pool cannot serve answers None at once, SGLang's
        # answer, rather than after the reserve's default 20 ms of retries
        # on the scheduler's thread, which stalled every admission attempt
        # on a full pool (the multi-replica benchmark's one-replica shared
        # run on the H200: TPOT 24.9 ms against 3.7). The refusal asks the
        # other sessions for their reserves, whose threads answer within a
        # tick, so the next call finds their pages; a refill of this
        # reserve's own thread in flight is waited for in any case.
        self._reserve_options.setdefault("starved_wait", 0)
        self._reserve = None
        # Per page id: True while taken from the open reserve and not put
        # back (the pages a free may put back without a round trip). Read
        # through _taken, which first marks what the head handed out.
        self._taken_bits = np.zeros(self.num_pages + 1, dtype=bool)
        self._head = None
        # Pages freed but held back from the reserve, oldest first, as
        # SGLang holds them: the token allocator's freed slots queue behind
        # its free list, and with need_sort they are parked until a merge.
        self._held = []
        self._num_held = 0
        self._hold_limit = max(64, self.num_pages // 8)
        # The token allocator's frees of CUDA slots whose copies to the
        # host have not been read (_unread_frees.py; None: every free is
        # read as it is made), and whether they are being read now.
        self._unread = None
        self._reading_frees = False
        self._slot_offsets = np.arange(self.page_size, dtype=np.int64)
        self._scratch = np.zeros(self.num_pages + 1, dtype=np.int64)
        self._index = np.arange(self.num_pages + 1, dtype=np.int64)
        self._staging = None  # _PinnedStaging for a CUDA device, lazily
        # The slots of the reserve's next pages on the device, so that
        # alloc(need_size) is a slice (None: mirror_pages=0, or a library
        # without pagealloc_reserve_peek: a copy per call). On CUDA, the
        # stream its slots were written on (a raw handle) and an event
        # after that, for a caller that allocates on another stream.
        self._mirror = None
        # The token allocator's (page size 1) instead holds the head of its
        # free list, taken from the reserve (_reserve_head.py): its alloc is
        # a slice without a library call, as SGLang's is.
        if int(mirror_pages) and self._use_reserve and self.page_size == 1:
            self._head = ReserveHead(self._mirror_to_device,
                                     self._mirror_concat, int(mirror_pages))
            # The head fills up from half of what the reserve holds: a low
            # mark of the head's size keeps that much there (the reserve's
            # thread refills to twice it, off the step), half the
            # reserve's default bound at most (a quarter of the pool).
            self._reserve_options.setdefault(
                "initial_batch", max(1, min(int(mirror_pages),
                                            self.num_pages // 8)))
        elif int(mirror_pages) and _native.HAS_RESERVE_PEEK:
            self._mirror = ReserveMirror(self.page_size,
                                         self._mirror_to_device,
                                         self._mirror_concat,
                                         int(mirror_pages))
        self._mirror_stream = None
        self._mirror_writer = None  # its torch stream object
        self._mirror_event = None
        # Frees of whole pages of the reserve in one library call
        # (_free_to_reserve): the paged allocator's unsorted free, whose
        # pages go straight back on the reserve's top. The page ids it
        # freed, and a pinned host copy of CUDA slots (grown as needed).
        self._frees_in_one_call = (_native.HAS_RESERVE_FREE_SLOTS and
                                   self.page_size > 1 and not self.need_sort)
        # The token allocator's frees go under the reserve's pages, at
        # each free (_release_pages; a library before put_under holds
        # them back instead).
        self._frees_go_under = (_native.HAS_RESERVE_PUT_UNDER and
                                self.page_size == 1 and not self.need_sort)
        self._freed_pages = np.empty(self.num_pages + 1, dtype=np.int64)
        self._freed_pages_address = self._freed_pages.ctypes.data
        # The pages an expansion on the device took (it takes at most the
        # pool).
        self._expansion_pages = np.empty(self.num_pages + 1, dtype=np.int64)
        self._expansion_address = self._expansion_pages.ctypes.data
        self._free_copy = np.empty(0, dtype=np.int64)
        self._free_copy_address = None
        if self._use_reserve:
            self._open_reserve()

    # ------------------------------------------------------------ session

    @property
    def client(self):
        """The pagealloc.Client this allocator's calls go through."""
        return self._client

    @property
    def size_full(self):
        return self.size

    def get_kvcache(self):
        """The KV cache passed to the constructor (SGLang's KVCache)."""
        return self._kvcache

    def kv_buffers(self):
        """The daemon's KV buffers (docs/design.md section 11) by name
        ("k.0", "v.0", ... for an mha layout, "kv.0", ... for mla): torch
        tensors where PyTorch is importable, else NumPy arrays (CPU
        backend). Empty when the daemon hands out slot indices only."""
        out = {}
        for buf in self._client.kv_buffers():
            out[buf.name] = buf.as_torch() if torch is not None else (
                np.asarray(buf))
        return out

    def debug_print(self):
        stats = self._client.stats()
        return ("#free pages: %d, #parked pages: %d, #used pages: %d, "
                "#sessions: %d" % (stats.free_pages, stats.parked_pages,
                                   stats.used_pages, stats.sessions_active))

    def available_size(self):
        """Free slots of the pool as SGLang counts them: the daemon's free
        and parked pages (GetStats), this session's reserve and the pages
        it holds back for a merge. Other sessions of the pool change it
        between two reads, and a refill the reserve's thread has in flight
        is in neither count for its round trip."""
        reserve = self._reserve
        for _ in range(3):
            before = reserve.stats() if reserve is not None else None
            stats = self._client.stats()
            if reserve is None:
                break
            after = reserve.stats()
            # A refill or a return between the two reads moves pages
            # between the counts: read again.
            if (before["refills"], before["returns"]) == (after["refills"],
                                                          after["returns"]):
                break
        # Cached shared prefix pages that no session holds count too: an
        # allocation that finds the free list short evicts them (docs/
        # design.md section 13), so they are this scheduler's to take.
        pages = (stats.free_pages + stats.parked_pages + self._num_held +
                 stats.prefix_evictable_pages)
        if self._unread is not None:
            # Freed already, as SGLang counts a free at once.
            pages += self._unread.slots // self.page_size
        if reserve is not None:
            pages += after["pages"]
        if self._head is not None:
            pages += len(self._head)
        return pages * self.page_size

    # SGLang's scheduler hooks (newer SGLang calls these on every
    # allocator); they need SGLang's own cache code, imported on use.
    def evict_to_free_tokens(self, tree_cache, num_tokens):
        from sglang.srt.mem_cache.common import evict_from_tree_cache
        evict_from_tree_cache(tree_cache, num_tokens)

    def check_decode_capacity(self, *, num_tokens, tree_cache):
        self.evict_to_free_tokens(tree_cache, num_tokens)
        return self.available_size() >= num_tokens

    def verify_byte_accounting(self):
        return []

    def translate_kv_indices_for_transfer(self, kv_indices):
        return kv_indices

    def get_cpu_copy(self, indices, mamba_indices=None):
        return self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None):
        return self._kvcache.load_cpu_copy(kv_cache_cpu, indices,
                                           mamba_indices=mamba_indices)

    # ------------------------------------------------------------ reserve

    @property
    def reserve(self):
        """The session's pagealloc.PageReserve this allocator takes its
        pages from (None with use_reserve=False, or until the next alloc
        after the thin path took its pages back)."""
        return self._reserve

    @property
    def mirror_stats(self):
        """The device mirror of the reserve's top (None without one):
        pages mirrored now, takes it answered with a slice (hits) and takes
        it did not (misses: the slots were copied)."""
        mirror = self._mirror if self._head is None else self._head
        if mirror is None:
            return None
        return dict(pages=len(mirror), hits=mirror.hits,
                    misses=mirror.misses)

    def pages_published(self, pages):
        """Takes note that `pages` (ids this allocator handed out) are
        published to the daemon's prefix index: they are shared now, never
        to go back into the reserve. A later free of one through this
        allocator goes to the daemon, which drops the session's reference
        (the page stays cached for the other sessions)."""
        pages = _as_host_int64(pages, "pages")
        self._read_frees(wait=True)
        if pages.size:
            in_range = (pages >= 1) & (pages <= self.num_pages)
            self._taken[pages[in_range]] = False
            if self._reserve is not None and self._frees_in_one_call:
                # The reserve's books too: its one-call free checks them.
                self._reserve.disown(pages)

    def _open_reserve(self):
        """Opens the session's reserve. One that may hold the whole pool
        (reserve_options max_pages >= num_pages) on a pool with every page
        free starts with all of them in the pool's order, so that a lone
        scheduler's slots are SGLang's (docs/design.md section 10)."""
        self._reserve = self._client.reserve(**self._reserve_options)
        self._taken[:] = False
        if self._reserve_options.get("max_pages", 0) < self.num_pages:
            return
        # The reserve's thread may be refilling meanwhile (its pages are in
        # neither count while in flight): a few tries, after which another
        # session holds pages and the reserve stays a plain one.
        for _ in range(200):
            stats = self._client.stats()
            free = stats.free_pages + stats.parked_pages
            if free + self._reserve.stats()["pages"] != self.num_pages:
                time.sleep(0.001)
                continue
            try:
                pages = self._reserve.take(self.num_pages)
            except ResourceExhaustedError:
                time.sleep(0.001)
                continue
            self._reserve.put(pages[::-1])
            return

    def _live_reserve(self):
        if self._reserve is None:
            self._open_reserve()
        return self._reserve

    def _close_reserve(self):
        """Returns the reserve's pages and those held back to the daemon;
        the pages handed out stay the session's and are freed through the
        daemon from here on. Returns whether any page went back."""
        self._read_frees(wait=True)
        reserve = self._reserve
        if reserve is None:
            return False
        self._flush_held()
        if self._head is not None:
            # The head's pages, the next handed out, go back on top.
            head = self._head.drain()
            if head.size:
                reserve.put(head[::-1])
        moved = reserve.stats()["pages"] > 0
        self._reserve = None
        reserve.close()
        self._taken[:] = False
        return moved

    def _flush_held(self):
        """Puts the held-back pages into the reserve (unordered)."""
        if not self._held:
            return
        held = np.concatenate(self._held)
        self._held, self._num_held = [], 0
        self._reserve.put(held[::-1], self._free_stream())

    def _merge_held(self):
        """SGLang's merge of what it holds back into its free list, on the
        reserve: takes the reserve's pages (its free list, front first),
        appends the held pages (the token allocator's queue) or sorts them
        in (need_sort), and puts the whole list back in that order."""
        self._read_frees(wait=True)
        reserve = self._reserve
        held = np.concatenate(self._held)
        # The token allocator's head is the list's front: it goes in first
        # (need_sort sorts it with the rest, as SGLang's merge does).
        head = (self._head.drain() if self._head is not None else
                np.zeros(0, dtype=np.int64))
        try:
            # What it holds, with no round trip (the reserve's thread may
            # return pages meanwhile).
            listed = reserve.take_held(self.num_pages)
        except ResourceExhaustedError:
            # A library older than take_held: the thread returned pages
            # between its count and its take, and the pool could not make
            # up for them. The held pages go on top of what it holds.
            listed = np.zeros(0, dtype=np.int64)
        merged = np.concatenate((head, listed, held))
        if self.need_sort:
            merged.sort()
        self._held, self._num_held = [], 0
        reserve.put(merged[::-1], self._free_stream())

    def _alloc_pages(self, num_pages):
        """`num_pages` whole pages from the reserve as the slots of those
        pages, or None when the pool (after SGLang's merge) cannot supply
        them: a slice of the mirror's slots when they are its next pages,
        else a copy of theirs."""
        reserve = self._live_reserve()
        if self._num_held and num_pages > reserve.stats()["pages"]:
            self._merge_held()
        mirror = self._mirror
        if mirror is not None and len(mirror) < num_pages:
            top = reserve.peek(mirror.max_pages)
            if top.size >= num_pages:
                mirror.refresh(top)
        try:
            pages = reserve.take(num_pages)
        except ResourceExhaustedError:
            return None
        self._taken[pages] = True
        if mirror is not None:
            slots = mirror.take(pages)
            if slots is not None:
                if self._mirror_stream is not None:
                    self._order_mirror(slots)
                return slots
        if self.page_size == 1:
            slots = pages
        else:
            slots = (pages[:, None] * self.page_size +
                     self._slot_offsets).reshape(-1)
        return self._slots_result(slots)

    def _mirror_to_device(self, slots):
        """The mirror's slots on the device (_slots_result)."""
        out = self._slots_result(slots)
        self._note_mirror_stream()
        return out

    def _mirror_concat(self, first, second):
        """Two of the mirror's device values joined, a new one."""
        if torch is None:
            return np.concatenate((first, second))
        out = torch.cat((first, second))
        self._note_mirror_stream()
        return out

    def _note_mirror_stream(self):
        """On CUDA: the stream the mirror's slots were written on (a raw
        handle). No event is recorded here: a caller on another stream is
        ordered by one recorded on this stream when it comes
        (_order_mirror), which follows the write as well."""
        if torch is None or self._torch_device.type != "cuda":
            return
        raw = self._current_raw_stream(self._device_index)
        if raw != self._mirror_stream:  # its torch object looked up anew
            self._mirror_writer = self._current_torch_stream()
            self._mirror_stream = raw

    def _current_torch_stream(self):
        """The current CUDA stream's torch object, found by its raw handle in
        the allocator's cache (torch.cuda.current_stream() builds a new one
        each call)."""
        index = self._device_index
        if index is None:
            index = torch.cuda.current_device()
        key = (index, self._current_raw_stream(index))
        stream = self._streams.get(key)
        return stream if stream is not None else self._stream(key)

    def _order_mirror(self, slots):
        """A caller on another stream than the mirror's write: its stream
        waits for the write, and the slots' memory stays allocated for it
        (the caching allocator's record_stream)."""
        raw = self._current_raw_stream(self._device_index)
        if raw == self._mirror_stream:
            return
        if self._mirror_event is None:
            self._mirror_event = torch.cuda.Event()
        # Recorded now on the writer's stream: after the mirror's write,
        # which was queued there before.
        self._mirror_event.record(self._mirror_writer)
        stream = torch.cuda.current_stream(self._device_index)
        stream.wait_event(self._mirror_event)
        slots.record_stream(stream)

    def _slots_result(self, slots):
        """Host slots as the caller's result: a NumPy array without
        PyTorch, a CPU tensor over the same memory, or a tensor on the
        CUDA device filled by one copy on the current stream (no host
        synchronisation)."""
        if torch is None:
            return slots
        if self._torch_device.type == "cpu":
            return torch.from_numpy(slots)
        if self._staging is None:
            self._staging = _PinnedStaging(self._torch_device,
                                           self._current_torch_stream)
        return self._staging.copy(slots)

    def _release_pages(self, pages, checked=False, device_slots=None):
        """Gives pages of this session back, the first the next handed out:
        into the reserve (or held back, as SGLang holds them) when the
        reserve handed them all out, else to the daemon (_thin_free).
        Raises, and nothing is freed, for a page named twice or one the
        daemon refuses. `checked`: _whole_pages found them distinct pages
        the reserve handed out. `device_slots`: their slots, page after
        page, on the allocator's device (the device mirror joins them
        without a copy from the host), or None."""
        if not checked:
            if (self._reserve is None or pages.min() < 1 or
                    pages.max() > self.num_pages or
                    not self._taken[pages].all()):
                self._thin_free(self._client.free_pages, pages, _IN_ORDER)
                return
            self._check_distinct(pages, "free")
        self._taken[pages] = False
        if self._frees_go_under:
            # The token allocator's frees queue behind its free list: under
            # the reserve's pages, in the order freed. There they count as
            # the reserve's, so its thread neither refills in their place
            # nor keeps them from a starving session.
            self._reserve.put_under(pages, self._free_stream())
        elif self.need_sort or self.page_size == 1:
            self._held.append(pages.copy())
            self._num_held += pages.size
            # (A library before put_under.) The token allocator's queue
            # merges at any time without changing an order (its pages go
            # behind the free list either way): bounded, so that the
            # reserve's thread can give them to a starving session.
            # need_sort's parked pages wait for the merge SGLang makes.
            if not self.need_sort and self._num_held > self._hold_limit:
                self._merge_held()
        else:
            # The reserve is a stack: the first page goes on last.
            self._reserve.put(pages[::-1], self._free_stream())
            if self._mirror is not None:
                self._mirror.prepend(pages, device_slots)

    def _check_distinct(self, pages, what):
        """Raises InvalidArgumentError for a page named twice in `pages`
        (ids in [1, num_pages]): each writes its index into a scratch
        array, and an earlier one overwritten names a page again."""
        index = (self._index[:pages.size] if pages.size <= self._index.size
                 else np.arange(pages.size))
        self._scratch[pages] = index
        same = self._scratch[pages] == index
        if not same.all():
            raise InvalidArgumentError(
                "%s names page %d twice" %
                (what, pages[np.flatnonzero(~same)[0]]))

    def _thin_free(self, method, values, order):
        """A free through the daemon (Client.free or free_pages), fenced on
        the current stream on the GPU. The reserve's pages are the
        session's in the daemon's books, so the daemon could not refuse one
        named by mistake: with a reserve open they go back to the daemon
        first, which then refuses any page not handed out."""
        self._close_reserve()
        method(values, self._free_stream(), order=order)

    def _free_stream(self):
        """The current stream's cudaStream_t to fence a free on, or None
        (the CPU backend, or no fast channel: freed as the host calls)."""
        if not self._fenced:
            return None
        return self._current_raw_stream(self._device_index)

    def _current_raw_stream(self, index):
        """The current stream of CUDA device `index` (None: the current
        device) as a cudaStream_t int."""
        if index is None:
            index = torch.cuda.current_device()
        raw = self._raw_stream or _raw_stream_function()
        return raw(index)

    def _whole_pages(self, slots, what="free_index"):
        """The pages of `slots` when they are whole, distinct pages the
        reserve handed out (page_size slots per page, each page's in
        order): their ids in the order given; None when they are not all
        such pages (the daemon's to check). Raises InvalidArgumentError,
        changing nothing, for a partial or malformed page of the reserve
        (SGLang's check of complete page blocks) or a page named twice."""
        if self._reserve is None:
            return None
        pages = self._pages_of_whole(slots)
        if pages is None:
            return self._not_whole(slots, what)
        if pages.min() < 1 or pages.max() > self.num_pages:
            return self._not_whole(slots, what)
        taken = self._taken[pages]
        if not taken.all():
            # None of the reserve's, or some only (the daemon frees them
            # all, the reserve's given back first).
            return None
        self._check_distinct(pages, what)
        return pages

    def _pages_of_whole(self, slots):
        """The page ids of `slots` when they are whole pages (page_size
        slots per page, each page's in order), in the order given; else
        None. Ranges and owners are not checked."""
        ps = self.page_size
        if ps == 1:
            return slots
        if slots.size % ps:
            return None
        blocks = slots.reshape(-1, ps)
        pages = blocks[:, 0] // ps
        if not (blocks == (pages * ps)[:, None] + self._slot_offsets).all():
            return None
        return pages

    def _not_whole(self, slots, what):
        """_whole_pages of slots that are not whole pages of the pool:
        None when none lies in a page the reserve handed out, else the
        error that names the first partial page."""
        ps = self.page_size
        page_of = slots // ps
        in_range = (page_of >= 1) & (page_of <= self.num_pages)
        touched = np.zeros(slots.size, dtype=bool)
        touched[in_range] = self._taken[page_of[in_range]]
        if not touched.any():
            return None
        outside = np.flatnonzero(~in_range)
        if outside.size:
            raise InvalidArgumentError(
                "%s[%d] (%d) lies outside the pool's slots [%d, %d)" %
                (what, outside[0], slots[outside[0]], ps,
                 (self.num_pages + 1) * ps))
        if slots.size % ps:
            raise InvalidArgumentError(
                "%s requires complete page blocks: numel=%d, page_size=%d" %
                (what, slots.size, ps))
        blocks = slots.reshape(-1, ps)
        bad = int(np.flatnonzero(np.any(
            blocks != (blocks[:, :1] // ps * ps) + self._slot_offsets,
            axis=1))[0])
        raise InvalidArgumentError(
            "%s[%d:%d] (%s) is not one whole page of %d slots" %
            (what, bad * ps, bad * ps + ps, blocks[bad].tolist(), ps))

    # --------------------------------------------------------- free lists

    def _lists(self):
        self._read_frees(wait=True)
        max_pages = max(1, min(self.num_pages, 1 << 20))
        return self._client.free_lists(max_pages=max_pages)

    def _out_array(self, array):
        if torch is None:
            return array
        return torch.as_tensor(np.array(array, dtype=np.int64),
                               device=self._torch_device)

    @property
    def free_pages(self):
        """The daemon's free list, front first (a snapshot, GetFreeLists)."""
        return self._out_array(self._lists()[0])

    @property
    def release_pages(self):
        """The daemon's parked pages (a snapshot; compare as a set: the
        daemon keeps them in the order freed, SGLang prepends each free)."""
        return self._out_array(self._lists()[1])

    def get_all_free_pages(self):
        free, parked = self._lists()
        return self._out_array(np.concatenate((free, parked)))

    def merge_and_sort_free(self):
        """Merges the parked pages into the free list, sorted (need_sort).

        The daemon has no call of its own for it: this sends one request
        longer than the pool, which the sglang profile's merge trigger
        counts (a merge whenever pages are parked) and which is then refused
        for its length, so it never takes a page, whatever other sessions
        do meanwhile."""
        if not self.need_sort:
            return
        self._read_frees(wait=True)
        if self._reserve is not None:
            if self._held:
                self._merge_held()
            return
        allocation = self._client.alloc(
            [(self.num_pages + 1) * self.page_size], all_or_nothing=True)
        self._client.release(allocation)

    # -------------------------------------------------------------- frees

    def _free_slots_now(self, slots):
        raise NotImplementedError

    def _read_frees(self, wait, own=None):
        """Frees, oldest first, the token allocator's queued frees whose
        copies have landed on the host (all of them, waiting for each,
        when `wait`), as free() frees host slots. A free that cannot be
        made (a slot named twice, one of no page this session holds)
        raises here, at the call that reads it, and frees none of its
        slots; the later ones stay to be read. `own`: the number of the
        free the calling free() queued, whose error is its own."""
        unread = self._unread
        if unread is None or not len(unread) or self._reading_frees:
            return
        self._reading_frees = True
        try:
            count = unread.landed(wait)
            if count > 1 and self._put_under_reserve(
                    unread.joined(count), fence=not unread.copied(count)):
                unread.drop(count)
                return
            # One by one: a single free, or a joined read the reserve
            # refused (one of them is not the reserve's whole pages).
            for _ in range(count):
                number, slots, copied = unread.read()
                try:
                    self._free_host_slots(slots, fence=not copied)
                except InvalidArgumentError as error:
                    if number == own:
                        raise
                    raise InvalidArgumentError(
                        "an earlier free of %d CUDA slots, read now: %s" %
                        (slots.size, error)) from None
        finally:
            self._reading_frees = False

    def _put_under_reserve(self, slots, fence):
        """The token allocator's frees of `slots` (host int64) under the
        reserve's pages in one call, when the library takes them all: it
        checks what _whole_pages would (each page in the pool, handed out
        by the reserve, named once) and refuses all of them or none. True
        when taken; False when refused or the frees do not go under.
        `fence`: queue the pages' release on the current stream (False for
        read frees, whose copies landed after the work queued before
        them)."""
        if not (self._frees_go_under and self._reserve is not None):
            return False
        try:
            self._reserve.put_under(
                slots, self._free_stream() if fence else None)
        except InvalidArgumentError:
            return False
        self._taken[slots] = False
        return True

    def _free_host_slots(self, slots, given=None, fence=True):
        """free() of host int64 slots outside a free group: whole pages of
        the reserve back into it, anything else the checked way. `given`:
        the slots as the caller gave them (their device tensor joins the
        mirror without a copy), or None. `fence`: as _put_under_reserve's."""
        if slots.size == 0:
            return
        # The common free is that one call; a refusal goes the checked way
        # below, which says why or frees through the daemon.
        if self._put_under_reserve(slots, fence):
            return
        pages = self._whole_pages(slots)
        if pages is not None:
            self._release_pages(pages, checked=True,
                                device_slots=self._on_device_as_given(
                                    given, slots) if given is not None
                                else None)
        else:
            self._free_slots_now(slots)

    def free(self, free_index):
        """Frees the pages of `free_index` (slots), SGLang's way; inside a
        free group, at free_group_end. Refused frees raise (the daemon
        checks ownership and double frees; docs/python.md)."""
        if self.free_group is None and self._reserve is not None and \
                self._frees_in_one_call:
            slots = self._free_to_reserve(free_index)
            if slots is None:
                return
        else:
            slots = _as_host_int64(free_index, "free_index")
        if self.free_group is None:
            self._free_host_slots(slots, given=free_index)
        elif slots.size:
            # Partial pages of the reserve are refused here, before the
            # group keeps them (SGLang's check).
            self._whole_pages(slots)
            self.free_group.append(slots.copy())

    def _free_to_reserve(self, values):
        """The step's common free, in one library call
        (PageReserve.free_slots): whole pages that the reserve handed out
        (and that were not published since: pages_published) go back on
        its top, and before the device mirror. A CUDA tensor is read by
        that call on the current stream, which it waits for, as SGLang's
        own free waits in torch.unique; host slots are fenced on the
        current stream. Returns None once freed (or for no slots); else,
        having freed nothing, the slots as a host int64 array for the
        checked path to decide (slots that are not whole pages, pages not
        all the reserve's, a page named twice: it says which, or frees
        through the daemon)."""
        device = self._device_int64(values)
        reserve = self._reserve
        if device is not None:
            n = device.numel()
            if n == 0:
                return None
            if n // self.page_size > self._freed_pages.size:
                # More pages than the pool: the checked path says why.
                return _as_host_int64(device, "free_index")
            host = self._free_copy
            if host.size < n:
                host = self._free_copy = _pinned_int64(max(n, 2 * host.size))
                self._free_copy_address = host.ctypes.data
            try:
                # free_slots' checks are made above: the call alone.
                count = reserve._free_slots_at(
                    _native.MEMORY_DEVICE, device.data_ptr(), n,
                    self._current_raw_stream(self._device_index), 0,
                    self._free_copy_address, self._freed_pages_address)
            except InvalidArgumentError:
                return host[:n].copy()
        else:
            slots = _as_host_int64(values, "free_index")
            if slots.size == 0:
                return None
            try:
                count = reserve.free_slots(slots, self._freed_pages,
                                           stream=self._free_stream(),
                                           fence=self._fenced)
            except InvalidArgumentError:
                return slots
            if self._mirror is not None:
                device = self._on_device_as_given(values, slots)
        pages = self._freed_pages[:count]
        self._taken[pages] = False
        if self._mirror is not None:
            self._mirror.prepend(pages, device)
        return None

    @property
    def _taken(self):
        """_taken_bits, with the pages the head handed out since the last
        read marked first: the token allocator's alloc only moves the
        head's cursor (_reserve_head.py), and a run of them is marked here
        in one write."""
        head = self._head
        if head is not None:
            handed_out = head.unmarked()
            if handed_out is not None:
                self._taken_bits[handed_out] = True
        return self._taken_bits

    def _device_int64(self, values):
        """`values` as a one-dimensional int64 CUDA tensor on the
        allocator's device (converted there when it is another integer
        type, as SGLang's int32 req_to_token rows are), or None for
        anything else (read on the host)."""
        if (torch is None or not isinstance(values, torch.Tensor) or
                not values.is_cuda or
                (self._device_index is not None and
                 values.device.index != self._device_index)):
            return None
        if values.dtype is torch.int64:
            if values.dim() == 1 and values.is_contiguous():
                return values  # the step's free: nothing to convert
        elif values.is_floating_point() or values.is_complex():
            return None  # _as_host_int64 says what is wrong with it
        # reshape keeps a strided one-dimensional view as it is.
        return values.detach().reshape(-1).to(torch.int64).contiguous()

    def _on_device_as_given(self, values, host):
        """`values` (whose int64 host copy is `host`) on the allocator's
        device as the mirror holds slots, where that needs no copy from the
        host; else None."""
        if self._mirror is None:
            return None
        if torch is None:
            return host
        if self._torch_device.type == "cpu":
            return torch.from_numpy(host)
        return self._device_int64(values)  # the mirror joins it by a copy

    def free_page_ids(self, page_ids):
        """Frees pages by id (SGLang's free_page_ids), the first the next
        handed out; inside a free group, at free_group_end."""
        pages = _as_host_int64(page_ids, "page_ids")
        if pages.size == 0:
            return
        self._read_frees(wait=True)
        if self.free_group is not None:
            self.free_group.append((pages[:, None] * self.page_size +
                                    self._slot_offsets).reshape(-1))
            return
        self._release_pages(pages)

    def free_full(self, free_index):
        self.free(free_index)

    def free_segment(self, free_index, start_pos=0):
        raise NotImplementedError

    def free_segments(self, segments):
        """Frees ascending (free_index, start_pos) segments of one request's
        row, one free_segment each."""
        for free_index, start_pos in segments:
            self.free_segment(free_index, start_pos=start_pos)

    @property
    def is_not_in_free_group(self):
        return self.free_group is None

    def free_group_begin(self):
        if self.free_group is not None:
            raise RuntimeError("free groups cannot be nested")
        self.free_group = []
        self.free_page_reps_group = []

    def free_group_end(self):
        """Frees what the group collected: the reserve's pages back into
        it, the daemon's as one call to the daemon."""
        pending, self.free_group = self.free_group, None
        reps, self.free_page_reps_group = self.free_page_reps_group, []
        if self._reserve is not None and reps:
            # free_segment calls made before the reserve opened (one slot
            # per page) do not mix with whole-page slots in one free:
            # their pages go after.
            if pending:
                self._free_slots_now(np.concatenate(pending))
            self._release_pages(np.concatenate(reps) // self.page_size)
            return
        parts = (pending or []) + reps
        if parts:
            self._free_slots_now(np.concatenate(parts))

    # ------------------------------------------------------------- states

    def backup_state(self):
        """Takes a checkpoint of the session; returns it as a value. The
        reserve's pages go back to the daemon first (a rollback returns
        what the session was given since, which a reserve's refills are)."""
        self._close_reserve()
        return AllocatorState(checkpoint_id=int(self._client.checkpoint()),
                              session_id=self._client.session_id)

    def restore_state(self, state):
        """Returns the pages this session was given since `state` (and
        still holds) to the front of the free list. Raises
        FailedPreconditionError when the checkpoint has ended (a restore to
        an older state, clear(), or more than 64 newer ones)."""
        if not isinstance(state, AllocatorState):
            raise TypeError("state must come from backup_state(), not %s" %
                            type(state).__name__)
        if state.session_id != self._client.session_id:
            raise ValueError("state %r is another session's" % (state,))
        self._close_reserve()
        self._client.rollback(state.checkpoint_id)

    def clear(self):
        """Frees every page of this session and ends its checkpoints; the
        free list is reset to 1..num_pages when no session holds a page."""
        self.free_group = None
        self.free_page_reps_group = []
        self._release_all()
        self._close_reserve()
        self._client.clear_session()

    # ------------------------------------------------------------ results

    def _ring_view(self):
        """The whole output ring, as one tensor (or array) built once:
        a result is a slice of it, not a new wrapper."""
        if self._ring is None:
            ring = self._client.ring
            if ring.on_device:
                view = _client_module.CudaSlots(ring.address,
                                                ring.capacity_slots, self)
                self._ring = torch.as_tensor(view, device=self._torch_device)
            else:
                array = _client_module._host_view(ring.address,
                                                  ring.capacity_slots, "<i8",
                                                  self._client)
                if torch is not None:
                    with warnings.catch_warnings():
                        # The mapping is read-only (the daemon writes it).
                        warnings.simplefilter("ignore", UserWarning)
                        array = torch.from_numpy(array)
                self._ring = array
        return self._ring

    def _release_all(self):
        while self._pending:
            allocation, event, index = self._pending.popleft()
            if event is not None:
                self._spare_events[index].append(event)
            self._client.release(allocation)

    def _release_done(self):
        """Releases the oldest allocations whose slots nobody reads any
        more: `keep` later calls made, and (GPU) the stream past the call
        `keep` later."""
        pending = self._pending
        keep = self._keep
        last = None
        while len(pending) > keep:
            later_event = pending[keep][1]
            if later_event is not None and not later_event.query():
                break
            last, event, index = pending.popleft()
            if event is not None:
                self._spare_events[index].append(event)
        if last is not None:
            self._client.release(last)  # and every allocation before it

    # One allocation call in stages (alloc_decode and alloc compose them;
    # the bench's --breakdown times each): the inputs as host addresses
    # (_decode_call, _extend_call, _alloc_call), the daemon's call
    # (_call), the stream ordered after it (_order), the result view with
    # its event (_out), the lazy release (_release_done).

    def _host_input(self, values, name, slot):
        """`values` as (a contiguous int64 NumPy array on the host, its
        address): NumPy arrays and CPU tensors in place where they are
        such already, CUDA tensors through pinned buffer `slot`, anything
        else converted (_as_host_int64)."""
        if type(values) is np.ndarray:
            if (values.dtype is _INT64 and values.ndim == 1 and
                    values.flags.c_contiguous):
                return values, values.ctypes.data
        elif torch is not None and isinstance(values, torch.Tensor):
            if values.is_cuda:
                return self._pinned_copy(values, slot)
            if (values.dtype is torch.int64 and values.is_contiguous() and
                    values.device.type == "cpu"):
                array = values.numpy()  # a view (int64 needs no grad)
                if array.ndim != 1:
                    array = array.reshape(-1)
                return array, values.data_ptr()
        array = _as_host_int64(values, name)
        return array, array.ctypes.data

    def _pinned_copy(self, values, slot):
        """A CUDA tensor copied, as int64, into pinned buffer `slot` on the
        tensor's current stream; returns (the buffer's NumPy view of the
        values, its address). The copy waits for the stream: the host reads
        the buffer next."""
        count = values.numel()
        buffer = self._pinned[slot]
        if buffer is None or buffer[1].size < count:
            capacity = max(count, 1024,
                           2 * buffer[1].size if buffer is not None else 0)
            tensor = torch.empty((capacity,), dtype=torch.int64,
                                 pin_memory=True)
            buffer = (tensor, tensor.numpy(), tensor.data_ptr())
            self._pinned[slot] = buffer
        tensor, array, address = buffer
        tensor.narrow(0, 0, count).copy_(values.detach().reshape(-1))
        return array[:count], address

    def _alloc_call(self, num_tokens):
        """Stage 1 of alloc: one request of `num_tokens` tokens."""
        self._tokens[0] = num_tokens
        return self._client._alloc_at, (self._tokens_address, 1), num_tokens

    def _call(self, method, args, slots=None):
        """Runs an allocation call (a Client._alloc*_at and its arguments
        less the options); on a full ring, waits for the oldest kept
        allocation's readers, releases it and tries once more. `slots`
        (the call's slots, or a function that counts them): a call of more
        slots than the ring holds returns None, SGLang's answer, since no
        release makes it fit (the default ring holds the whole pool, so
        such a call is one the pool cannot serve either)."""
        try:
            return method(*args, self._options)
        except ResourceExhaustedError:
            if slots is not None:
                needed = slots() if callable(slots) else slots
                if needed > self._client.ring.capacity_slots:
                    return None
            # Only the ring can be full here (a short pool refuses the
            # requests, it does not raise). On the GPU the newest event
            # says when every kept result has been read; on the host the
            # caller may still read them: no retry there.
            if not self._pending or self._pending[-1][1] is None:
                raise
            self._pending[-1][1].synchronize()
            self._release_all()
            self._client.flush_release()
            return method(*args, self._options)

    def _result(self, allocation):
        """SGLang's result of one call: None when refused for want of
        pages, else the slots (see the module's docstring)."""
        if allocation is None:  # _call: more slots than the ring holds
            return None
        if allocation.num_refused or allocation._num_slots <= 0:
            return self._other_result(allocation)
        out = self._out(allocation, self._order(allocation))
        self._release_done()
        return out

    def _other_result(self, allocation):
        """_result of a call that was refused or gave no slot."""
        if not allocation.ok:
            codes = np.array(allocation.codes)
            self._client.release(allocation)
            if np.all(codes == int(StatusCode.RESOURCE_EXHAUSTED)):
                return None
            # An all-or-nothing call refuses the others ABORTED after the
            # request that decided it: raise that one's error.
            for i, code in enumerate(codes):
                if code not in (int(StatusCode.OK), int(StatusCode.ABORTED)):
                    raise allocation[i].error
            allocation.check()
        if allocation.num_slots == 0:
            self._client.release(allocation)
            return self._empty()
        allocation.slots  # raises: the served slots are not one run
        raise AssertionError("unreachable: %r" % (allocation,))

    def _thin_result(self, call):
        """_result of a call through the daemon; one refused for want of
        pages gives the reserve's pages (and those held back) to the daemon
        and runs once more, so that a lone scheduler can use the whole
        pool. The reserve opens again at the next alloc."""
        out = self._result(self._call(*call))
        if out is None and self._close_reserve():
            out = self._result(self._call(*call))
        return out

    def _order(self, allocation):
        """The current stream, ordered on the GPU after the daemon's kernel
        that writes `allocation`'s slots: (device index, cudaStream_t), or
        None where nothing is ordered (the CPU backend, or no PyTorch)."""
        if not self._ordered:
            return None
        if self._ring is None:
            # torch's CUDA state starts with the ring's tensor, before the
            # raw stream read (which does not start it).
            self._ring_view()
        index = self._device_index
        if index is None:
            index = torch.cuda.current_device()
        raw = self._raw_stream(index)
        self._client._order_after_at(allocation, raw)
        return index, raw

    def _stream(self, key):
        """The torch stream object of (device index, cudaStream_t) `key`,
        the current stream of that device."""
        stream = torch.cuda.current_stream(key[0])
        if stream.cuda_stream != key[1]:  # changed meanwhile: not cached
            return stream
        if len(self._streams) >= _MAX_STREAMS:
            self._streams.clear()
        self._streams[key] = stream
        return stream

    def _out(self, allocation, stream):
        """The result of a served call (a view of the ring, or a copy) and,
        on the GPU, the event on `stream` (_order's) that ends its reads;
        keeps the allocation for the lazy release."""
        count = allocation._num_slots
        start = (allocation._view.all_slots - self._ring_address) >> 3
        event = None
        index = None
        if torch is None:
            if self._on_device:  # no ring tensor without PyTorch
                out = allocation.slots
            else:
                out = self._ring_view()[start:start + count]
            if self._keep == 0:
                out = np.array(out)
        else:
            ring = self._ring if self._ring is not None else self._ring_view()
            out = ring.narrow(0, start, count)
            if stream is not None:
                if self._keep == 0:
                    out = out.clone()
                torch_stream = self._streams.get(stream)
                if torch_stream is None:
                    torch_stream = self._stream(stream)
                index = stream[0]
                spare = self._spare_events[index]
                event = spare.pop() if spare else torch.cuda.Event()
                event.record(torch_stream)
            elif self._torch_device.type != "cpu":
                out = out.to(self._torch_device)  # a copy, done here
                self._client.release(allocation)
                return out
            elif self._keep == 0:
                out = out.clone()
        self._pending.append((allocation, event, index))
        return out

    def _empty(self):
        if torch is None:
            return np.zeros(0, dtype=np.int64)
        return torch.empty((0,), dtype=torch.int64, device=self._torch_device)

    def alloc_extend(self, *args, **kwargs):
        raise NotImplementedError("alloc_extend is only for paged allocator")

    def alloc_decode(self, *args, **kwargs):
        raise NotImplementedError("alloc_decode is only for paged allocator")

    def close(self):
        """Ends the session (the daemon frees its pages), also when a free
        read now raises."""
        try:
            self._release_all()
            self._close_reserve()
        finally:
            self._client.close()


class TokenToKVPoolAllocator(_Base):
    """SGLang's TokenToKVPoolAllocator (page_size 1) on a pagealloc daemon.

    ``alloc(n)`` returns n slots from the front of the free list, or None;
    ``free`` puts the slots back at the list's end in the order given
    (``--semantics=sglang`` at page size 1: FIFO reuse, as SGLang's).

    On the GPU a free of CUDA slots does not wait for the stream: it queues
    their copy to the host and is read at a later call (_unread_frees.py,
    docs/python.md), which raises for a free that cannot be made.
    """

    def __init__(self, size, dtype=None, device=None, kvcache=None,
                 need_sort=None, *, client=None,
                 keep_allocations=DEFAULT_KEEP_ALLOCATIONS,
                 client_name="sglang-token-allocator", use_reserve=True,
                 reserve_options=None, mirror_pages=None):
        super().__init__(size, 1, dtype, device, kvcache, need_sort, client,
                         keep_allocations, client_name, use_reserve,
                         reserve_options, mirror_pages)
        if (self._head is not None and torch is not None and
                _native.HAS_COPY_TO_HOST):
            self._unread = UnreadFrees(self._current_torch_stream,
                                       device_to_host_copier())

    def free(self, free_index):
        """Frees `free_index` (slots), each at the free list's end in the
        order given. CUDA slots on the allocator's device are read once
        their copy has landed (at a later call), not now."""
        if self._defers(free_index):
            if free_index.numel() == 0:
                return
            if self.free_group is not None:
                # Read at the group's end: a CUDA tensor as SGLang's group
                # holds it, a CPU tensor as it is now.
                self.free_group.append(free_index if free_index.is_cuda
                                       else free_index.clone())
                return
            if len(self._unread) >= MAX_UNREAD:
                self._read_frees(wait=True)
            own = self._unread.add(free_index)
            # A CPU tensor's free is read at once (it has landed); CUDA
            # frees once READ_BATCH are queued, those landed by then in one
            # call to the reserve.
            if not free_index.is_cuda or len(self._unread) >= READ_BATCH:
                self._read_frees(wait=False, own=own)
            return
        self._read_frees(wait=True)  # in order: the earlier frees first
        super().free(free_index)

    def _defers(self, values):
        """Whether a free of `values` is queued: an int64 or int32 tensor,
        on the CPU or on the allocator's CUDA device, with the reserve
        open (a CUDA tensor's is read at a later call, a CPU tensor's at
        once)."""
        # get_device() is an int; `device` builds an object each time.
        return (self._unread is not None and self._reserve is not None and
                isinstance(values, torch.Tensor) and
                values.dtype in (torch.int64, torch.int32) and
                (values.get_device() == self._device_index if values.is_cuda
                 else values.device.type == "cpu"))

    def free_group_end(self):
        """Frees what the group collected, in the order freed: its CUDA
        slots joined on the device and queued as one free."""
        pending = self.free_group
        if self._unread is None or not pending or not any(
                isinstance(p, torch.Tensor) for p in pending):
            super().free_group_end()
            return
        self.free_group = None
        self.free_page_reps_group = []
        if all(isinstance(p, torch.Tensor) for p in pending):
            self.free(torch.cat([p.reshape(-1).to(torch.int64)
                                 for p in pending]))
            return
        for part in pending:
            self.free(part)

    def alloc(self, need_size):
        """need_size slots from the front of the free list, or None."""
        need_size = int(need_size)
        head = self._head
        if head is not None:
            # The step's call: a slice of the head, as SGLang's is of its
            # free list.
            slots = head.take(need_size)
            if slots is not None:
                if self._mirror_stream is not None:
                    self._order_mirror(slots)
                return slots
        if need_size <= 0:
            return self._empty()
        if head is not None:
            return self._alloc_to_head(need_size)
        if self._use_reserve:
            return self._alloc_pages(need_size)
        return self._result(self._call(*self._alloc_call(need_size)))

    def _alloc_to_head(self, need_size):
        """alloc(need_size) that the head cannot serve alone: the rest
        taken from the reserve (after SGLang's merge when the two hold too
        few), and the head filled up to its bound ahead of the next calls
        with pages the reserve can spare (no round trip); None when the
        pool cannot supply them."""
        self._read_frees(wait=False)
        reserve = self._live_reserve()
        head = self._head
        head.misses += 1
        if need_size - len(head) > reserve.stats()["pages"]:
            if self._unread is not None and len(self._unread):
                # SGLang's free list holds every free made so far.
                self._read_frees(wait=True)
                reserve = self._live_reserve()
            if (self._num_held and
                    need_size - len(head) > reserve.stats()["pages"]):
                self._merge_held()  # which moves the head into the reserve
        short = need_size - len(head)
        try:
            pages = reserve.take(short)
        except ResourceExhaustedError:
            return None
        # Half of what the reserve holds at most: a head that emptied it
        # would send the next call short of pages to the pool itself (a
        # round trip) before the reserve's thread refilled. A reserve that
        # may hold the whole pool has nothing to refill.
        spare = reserve.stats()["pages"]
        if self._reserve_options.get("max_pages", 0) < self.num_pages:
            spare //= 2
        ahead = min(head.max_pages - len(head) - short, spare)
        if ahead > 0:
            # Of what it holds, never a round trip: the reserve's thread
            # may have returned some since the count.
            try:
                pages = np.concatenate((pages, reserve.take_held(ahead)))
            except ResourceExhaustedError:
                pass  # (a library older than take_held)
        head.extend(pages)
        slots = head.take(need_size)
        if self._mirror_stream is not None:
            self._order_mirror(slots)
        return slots

    def _free_slots_now(self, slots):
        self._release_pages(slots)

    def free_segment(self, free_index, start_pos=0):
        # Slot == page: the plain free is exact.
        self.free(free_index)


class PagedTokenToKVPoolAllocator(_Base):
    """SGLang's PagedTokenToKVPoolAllocator on a pagealloc daemon.

        allocator = PagedTokenToKVPoolAllocator(
            size, page_size, dtype, device, kvcache, need_sort,
            client="unix:///run/pagealloc/gpu0.sock")

    ``client``: a pagealloc.Client, a target to connect to, or None for
    $PAGEALLOC_TARGET. ``size`` must be the pool's slots (num_pages *
    page_size; None takes them from the daemon). ``keep_allocations``: see
    the module's docstring. ``use_reserve``: alloc and whole-page frees on
    the session's page reserve (the default), else through the daemon;
    ``reserve_options``: Client.reserve()'s keyword arguments (a
    ``max_pages`` of the whole pool makes a lone scheduler's slots
    SGLang's). ``mirror_pages``: the most of the reserve's next pages whose
    slots are kept on the device, so that ``alloc`` is a slice of a device
    tensor as SGLang's is (None: DEFAULT_MIRROR_SLOTS slots' worth, none at
    page size 1; 0: a host-to-device copy per call). The pages stay in the
    reserve until taken.
    """

    def __init__(self, size, page_size, dtype=None, device=None,
                 kvcache=None, need_sort=None, *, client=None,
                 keep_allocations=DEFAULT_KEEP_ALLOCATIONS,
                 client_name="sglang-paged-allocator", use_reserve=True,
                 reserve_options=None, mirror_pages=None):
        if int(page_size) < 2:
            raise ValueError("page_size %d: use TokenToKVPoolAllocator (or "
                             "make_allocator) at page size 1" % page_size)
        super().__init__(size, page_size, dtype, device, kvcache, need_sort,
                         client, keep_allocations, client_name, use_reserve,
                         reserve_options, mirror_pages)

    def alloc(self, need_size):
        """Whole pages: need_size // page_size of them, their slots in page
        order; None when the free list (after a merge) is short."""
        num_pages = int(need_size) // self.page_size
        if num_pages <= 0:
            return self._empty()
        if self._use_reserve:
            return self._alloc_pages(num_pages)
        return self._result(
            self._call(*self._alloc_call(num_pages * self.page_size)))

    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens,
                     seq_lens_cpu, last_loc, extend_num_tokens,
                     num_new_pages=None):
        """Extends each request from prefix_lens[i] to seq_lens[i] tokens;
        last_loc[i] is the slot of its last prefix token (-1 without a
        prefix). The daemon reads the *_cpu lengths and a host copy of
        last_loc. Returns extend_num_tokens slots, or None for the whole
        batch when it does not fit."""
        if self._expands_on_reserve():
            prefix, _ = self._host_input(
                prefix_lens_cpu if prefix_lens_cpu is not None
                else prefix_lens, "prefix_lens_cpu", _PREFIX)
            seq, _ = self._host_input(
                seq_lens_cpu if seq_lens_cpu is not None else seq_lens,
                "seq_lens_cpu", _SEQ)
            _check_extend_total(prefix, seq, extend_num_tokens)
            if seq.size == 0:
                return self._empty()
            out = self._expand_on_reserve(prefix, seq, last_loc)
            if out is not _THIN:
                return out
        call = self._extend_call(prefix_lens, prefix_lens_cpu, seq_lens,
                                 seq_lens_cpu, last_loc, extend_num_tokens)
        if call is None:
            return self._empty()
        return self._thin_result(call)

    def _extend_call(self, prefix_lens, prefix_lens_cpu, seq_lens,
                     seq_lens_cpu, last_loc, extend_num_tokens):
        """Stage 1 of alloc_extend: the call's method and host inputs, or
        None for an empty batch."""
        prefix, prefix_address = self._host_input(
            prefix_lens_cpu if prefix_lens_cpu is not None else prefix_lens,
            "prefix_lens_cpu", _PREFIX)
        seq, seq_address = self._host_input(
            seq_lens_cpu if seq_lens_cpu is not None else seq_lens,
            "seq_lens_cpu", _SEQ)
        last, last_address = self._host_input(last_loc, "last_loc", _LAST)
        _check_extend_total(prefix, seq, extend_num_tokens)
        if seq.size == 0:
            return None
        return self._client._alloc_extend_at, (
            prefix_address, prefix.size, seq_address, seq.size,
            last_address, last.size), lambda: int((seq - prefix).sum())

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        """One new token per request: seq_lens[i] counts it, last_loc[i] is
        the slot of the token before it. None for the whole batch when the
        new pages do not fit."""
        if self._expands_on_reserve():
            seq, seq_address = self._host_input(
                seq_lens_cpu if seq_lens_cpu is not None else seq_lens,
                "seq_lens_cpu", _SEQ)
            if seq.size == 0:
                return self._empty()
            if (self._num_held == 0 and self._reserve is not None and
                    _is_device_int64(last_loc, seq.size)):
                # The step's call: its arguments are checked here.
                return self._decode_on_device(seq, seq_address, last_loc)
            out = self._expand_on_reserve(None, seq, last_loc)
            if out is not _THIN:
                return out
        call = self._decode_call(seq_lens, seq_lens_cpu, last_loc)
        if call is None:
            return self._empty()
        return self._thin_result(call)

    # The legacy calls on the reserve, in this process (PageReserve's
    # alloc_extend / alloc_decode, docs/python.md "Slots expanded in
    # process"): planned here from the host lengths, the new pages taken
    # from the reserve, the slots written on the current stream from a
    # device last_loc. No round trip, no copy of last_loc to the host.

    def _expands_on_reserve(self):
        return self._use_reserve and _native.HAS_EXPANSION_PAGES

    def _expand_on_reserve(self, prefix, seq, last_loc):
        """The slots of alloc_extend (prefix: host prefix lengths) or
        alloc_decode (prefix None) expanded on the reserve; None when the
        pool cannot supply the pages after SGLang's merge; or _THIN for a
        call the daemon serves instead: a host last_loc that continues a
        page the reserve did not hand out (the daemon checks whose it
        is)."""
        on_device = (torch is not None and isinstance(last_loc, torch.Tensor)
                     and last_loc.is_cuda)
        if on_device:
            if (last_loc.dtype != torch.int64 or last_loc.dim() != 1 or
                    not last_loc.is_contiguous()):
                last_loc = last_loc.reshape(-1).to(torch.int64).contiguous()
        else:
            last_loc, _ = self._host_input(last_loc, "last_loc", _LAST)
            if not self._continues_taken_pages(prefix, seq, last_loc):
                return _THIN
        reserve = self._live_reserve()
        if self._num_held:
            # SGLang's merge of the parked pages (need_sort), on its
            # triggers: alloc_decode when the batch outnumbers the free
            # pages, alloc_extend when the extend's pages plus the batch
            # and one do.
            free = reserve.stats()["pages"]
            if prefix is None:
                merge = seq.size > free
            else:
                merge = (int((seq - prefix).sum()) // self.page_size +
                         seq.size + 1 > free)
            if merge:
                self._merge_held()
        # The current stream as a raw handle (torch's Stream object costs
        # more than the expansion's launch).
        stream = (self._current_raw_stream(last_loc.device.index)
                  if on_device else None)
        try:
            if prefix is None:
                out = reserve.alloc_decode(seq, last_loc, stream=stream)
            else:
                out = reserve.alloc_extend(prefix, seq, last_loc,
                                           stream=stream)
        except ResourceExhaustedError:
            # The reserve refills from the pool on this thread, and asks the
            # other sessions for theirs, before it refuses: the pool cannot
            # serve the batch (SGLang's None; nothing was taken).
            return None
        self._taken[reserve.last_expansion_pages(on_device)] = True
        if on_device:
            return out
        return self._slots_result(out)

    def _decode_on_device(self, seq, seq_address, last_loc):
        """alloc_decode on the reserve from a contiguous int64 CUDA
        last_loc of one entry per request (_expand_on_reserve's device
        case, the library's calls alone): the slots written on the
        current stream, or None when the pool cannot supply the pages."""
        n = seq.size
        out = torch.empty((n,), dtype=torch.int64, device=last_loc.device)
        reserve = self._reserve
        try:
            written = reserve._alloc_decode_at(
                seq_address, n, last_loc.data_ptr(), out.data_ptr(),
                self._current_raw_stream(last_loc.get_device()))
        except ResourceExhaustedError:
            return None  # as _expand_on_reserve: nothing was taken
        pages = self._expansion_pages
        count = reserve._expansion_pages_at(True, self._expansion_address,
                                            pages.size)
        self._taken[pages[:count]] = True
        return out if written == n else out[:written]

    def _continues_taken_pages(self, prefix, seq, last_loc):
        """Whether every request of a host batch that writes into the rest
        of its last_loc's page continues a page the reserve handed out."""
        if last_loc.size != seq.size:
            return False  # the daemon names the mismatch
        before = seq - 1 if prefix is None else prefix
        ps = self.page_size
        partial = (before % ps != 0) & (seq > before)
        if not partial.any():
            return True
        pages = last_loc[partial] // ps
        if pages.min() < 1 or pages.max() > self.num_pages:
            return False
        return bool(self._taken[pages].all())

    def _decode_call(self, seq_lens, seq_lens_cpu, last_loc):
        """Stage 1 of alloc_decode: the call's method and host inputs, or
        None for an empty batch."""
        seq, seq_address = self._host_input(
            seq_lens_cpu if seq_lens_cpu is not None else seq_lens,
            "seq_lens_cpu", _SEQ)
        last, last_address = self._host_input(last_loc, "last_loc", _LAST)
        if seq.size == 0:
            return None
        return self._client._alloc_decode_at, (
            seq_address, seq.size, last_address, last.size), seq.size

    def _free_slots_now(self, slots):
        """Whole pages of the reserve go back to it in the order given
        (SGLang's page-aligned free); other slots go to the daemon, which
        frees their distinct pages ascending (SGLang's free of partial
        pages from the legacy path)."""
        pages = self._whole_pages(slots)
        if pages is None:
            self._thin_free(self._client.free, slots, _ASCENDING)
        else:
            self._release_pages(pages, checked=True)

    def free_segment(self, free_index, start_pos=0):
        """Frees kv_row[start_pos : start_pos + n] of one request: one page
        per page of the segment, in the segment's order (no sort). Inside a
        free group the pages are freed with the group's slots at its end
        (on the reserve, in call order with them)."""
        slots = _as_host_int64(free_index, "free_index")
        if slots.size == 0:
            return
        offset = int(start_pos) % self.page_size
        if offset == 0:
            reps = slots[::self.page_size]
        else:
            reps = np.concatenate(
                (slots[:1], slots[self.page_size - offset::self.page_size]))
        if self._reserve is not None:
            # SGLang's current free_segment is its free of the segment's
            # pages: inside a group, in call order with the group's frees.
            pages = reps // self.page_size
            if self.free_group is not None:
                self.free_group.append(
                    (pages[:, None] * self.page_size +
                     self._slot_offsets).reshape(-1))
            else:
                self._release_pages(pages)
            return
        if self.free_group is not None:
            self.free_page_reps_group.append(reps)
            return
        self._release_pages(reps // self.page_size)


def _is_device_int64(values, n):
    """Whether `values` is a one-dimensional, contiguous int64 CUDA tensor
    of `n` entries (what the library's device expansion reads as is)."""
    return (torch is not None and isinstance(values, torch.Tensor) and
            values.is_cuda and values.dtype is torch.int64 and
            values.dim() == 1 and values.is_contiguous() and
            values.numel() == n)


def _check_extend_total(prefix, seq, extend_num_tokens):
    """SGLang's extend_num_tokens, when given, is the sum of the extends."""
    if extend_num_tokens is None:
        return
    total = int((seq - prefix).sum()) if seq.size else 0
    if int(extend_num_tokens) != total:
        raise ValueError(
            "extend_num_tokens (%d) is not the sum of seq_lens - prefix_lens "
            "(%d)" % (extend_num_tokens, total))


def make_allocator(client=None, *, size=None, page_size=None, dtype=None,
                   device=None, kvcache=None, need_sort=None,
                   keep_allocations=DEFAULT_KEEP_ALLOCATIONS, use_reserve=True,
                   reserve_options=None, mirror_pages=None):
    """SGLang's choice of allocator for the daemon's pool: the token one at
    page size 1, the paged one otherwise. Every argument left None is the
    pool's (page size, slots, free policy) or the backend's device.

    `client`: a pagealloc.Client, a target, or None for $PAGEALLOC_TARGET.
    `use_reserve`, `reserve_options`, `mirror_pages`: see
    PagedTokenToKVPoolAllocator.
    """
    session = _connect(client, "sglang-allocator")
    if page_size is None:
        page_size = session.pool.page_size
    options = dict(client=session, keep_allocations=keep_allocations,
                   use_reserve=use_reserve, reserve_options=reserve_options,
                   mirror_pages=mirror_pages)
    if int(page_size) == 1:
        return TokenToKVPoolAllocator(size, dtype, device, kvcache, need_sort,
                                      **options)
    return PagedTokenToKVPoolAllocator(size, page_size, dtype, device,
                                       kvcache, need_sort, **options)


def register_with_sglang():
    """Registers both classes as virtual subclasses of SGLang's
    BaseTokenToKVPoolAllocator (an abc), so that SGLang's isinstance checks
    accept them. Returns False when SGLang is not importable."""
    base = None
    for module in ("sglang.srt.mem_cache.allocator.base",
                   "sglang.srt.mem_cache.allocator"):
        try:
            base = getattr(__import__(module, fromlist=["x"]),
                           "BaseTokenToKVPoolAllocator")
            break
        except (ImportError, AttributeError):
            continue
    if base is None:
        return False
    base.register(TokenToKVPoolAllocator)
    base.register(PagedTokenToKVPoolAllocator)
    return True
