"""Frees of CUDA slots on their way to the host, oldest first.

SGLang's token allocator (page size 1) frees by appending the slots to a
device tensor: nothing waits for the GPU. The token allocator here keeps
its books on the host (which pages it handed out, which are freed), so a
free must read the slots, and a read of a CUDA tensor waits for every
kernel queued before it on the stream: a scheduler that frees while its
next forward runs (SGLang's overlap scheduler) would wait for that forward.
Instead the free only queues the copy: the slots go to pinned host memory
on the current stream, with an event after them, and the allocator reads
them once the event has passed, at a later call that needs them (or when
enough are on their way to be worth one read). By then the work queued
before the free is done, so a read page needs no release fence of its
own. A CPU tensor's slots are copied at once and land at once: every
tensor free takes the same way.

The copies land in a pinned ring per dtype, reused in the order the frees
are read (a region is written again only after the free that used it was
read, so after its copy landed); a free too large for the ring's free
space gets pinned memory of its own from PyTorch's cache instead.
"""

import collections

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover - depends on the host
    torch = None

# Frees on their way at most: the next waits for the oldest to land.
MAX_UNREAD = 64
# CUDA frees queued before a free reads those landed, in one call: a read
# costs about as much for one free as for many.
READ_BATCH = 16
# Slots a pinned ring holds (per dtype; 1 MiB of int64).
RING_SLOTS = 1 << 17


class _Free:
    """One queued free: its copy (`host`), the event after the copy (None:
    landed at once) and the ring it lies in (None: memory of its own)."""

    __slots__ = ("number", "host", "event", "ring")

    def __init__(self, number, host, event, ring):
        self.number = number
        self.host = host
        self.event = event
        self.ring = ring


class RingSpace:
    """Regions of a ring of `capacity` slots handed out in turn and given
    back oldest first: where each copy into a pinned ring goes. Regions
    never wrap, and a region never reaches the oldest live one (so a full
    ring and an empty one are told apart)."""

    def __init__(self, capacity):
        self.capacity = int(capacity)
        self._live = collections.deque()  # (start, end), oldest first
        self._tail = 0

    def __len__(self):
        return len(self._live)

    def place(self, count):
        """The start of a new live region of `count` slots (count >= 1),
        or None when the free space holds none that large."""
        if not self._live:
            start = 0 if count <= self.capacity else None
        else:
            oldest = self._live[0][0]
            if self._tail >= oldest:  # the live regions end at the tail
                if self._tail + count <= self.capacity:
                    start = self._tail
                else:
                    start = 0 if count < oldest else None
            else:
                start = self._tail if self._tail + count < oldest else None
        if start is not None:
            self._tail = start + count
            self._live.append((start, self._tail))
        return start

    def release(self):
        """Gives back the oldest live region."""
        self._live.popleft()
        if not self._live:
            self._tail = 0


class _PinnedRing:
    """A pinned host buffer of one dtype and the space of its regions."""

    def __init__(self, dtype):
        self.buffer = torch.empty((RING_SLOTS,), dtype=dtype, pin_memory=True)
        self.space = RingSpace(RING_SLOTS)


class UnreadFrees:
    """Copies of freed slots not yet read, oldest first. Not thread-safe
    (the allocator's). `current_stream`: a function returning the current
    CUDA stream's torch object, where the events are recorded."""

    def __init__(self, current_stream):
        self._current_stream = current_stream
        self._entries = collections.deque()  # of _Free
        self._rings = {}  # dtype -> _PinnedRing
        self._spare_events = []
        self._added = 0
        self._landed = 0  # the oldest entries known to have landed
        self.slots = 0  # in the entries

    def __len__(self):
        return len(self._entries)

    def add(self, values):
        """Queues the copy of `values` (an int64 or int32 tensor): a CUDA
        tensor's into pinned host memory on the current stream, a CPU
        tensor's now. Returns the free's number, which read returns with
        it."""
        count = values.numel()
        if values.is_cuda:
            ring = self._ring(values.dtype)
            start = ring.space.place(count)
            if start is None:
                ring = None
                # PyTorch's caching host allocator keeps the block until
                # the copy has run (it records the stream's use of it).
                host = torch.empty((count,), dtype=values.dtype,
                                   pin_memory=True)
            else:
                host = ring.buffer[start:start + count]
            host.copy_(values.reshape(-1), non_blocking=True)
            event = (self._spare_events.pop() if self._spare_events else
                     torch.cuda.Event())
            event.record(self._current_stream())
        else:
            host, event, ring = values.reshape(-1).clone(), None, None
        self._added += 1
        self._entries.append(_Free(self._added, host, event, ring))
        self.slots += count
        return self._added

    def landed(self, wait):
        """How many of the oldest frees have landed, in a row (all of
        them, waiting for each, when `wait`)."""
        entries = self._entries
        while self._landed < len(entries):
            event = entries[self._landed].event
            if event is not None and not event.query():
                if not wait:
                    break
                event.synchronize()
            self._landed += 1
        return self._landed

    def joined(self, count):
        """The slots of the oldest `count` frees (landed), joined in order
        as a new host int64 array; they stay queued."""
        parts = [self._entries[i].host.numpy() for i in range(count)]
        return np.concatenate(parts).astype(np.int64, copy=False)

    def copied(self, count):
        """Whether the oldest `count` frees all came through a copy on a
        stream (CUDA slots): once landed, the work queued before each free
        on that stream is done. A CPU tensor's free landed at once."""
        return all(self._entries[i].event is not None for i in range(count))

    def drop(self, count):
        """Removes the oldest `count` frees (landed and read)."""
        for _ in range(count):
            self._pop()

    def read(self):
        """(number, slots as a new host int64 array, copied: see copied())
        of the oldest free, removed; it must have landed."""
        entry = self._entries[0]
        slots = np.array(entry.host.numpy(), dtype=np.int64)
        copied = entry.event is not None
        self._pop()
        return entry.number, slots, copied

    def _pop(self):
        if not self._landed:
            raise AssertionError("read before its copy landed")
        entry = self._entries.popleft()
        self._landed -= 1
        self.slots -= entry.host.numel()
        if entry.event is not None:
            self._spare_events.append(entry.event)
        if entry.ring is not None:
            entry.ring.space.release()

    def _ring(self, dtype):
        ring = self._rings.get(dtype)
        if ring is None:
            ring = self._rings[dtype] = _PinnedRing(dtype)
        return ring
