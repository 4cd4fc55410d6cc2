"""Frees of CUDA slots on their way to the host, oldest first.

SGLang's token allocator (page size 1) frees by appending the slots to a
device tensor: nothing waits for the GPU. The token allocator here keeps
its books on the host (which pages it handed out, which are freed), so a
free must read the slots, and a read of a CUDA tensor waits for every
kernel queued before it on the stream: a scheduler that frees while its
next forward runs (SGLang's overlap scheduler) would wait for that forward.
Instead the free only queues the copy: the slots go to pinned host memory
on the current stream (one call to the library, cudaMemcpyAsync, where a
tensor's copy_ would dispatch an operation first), and the allocator reads
them once an event recorded after the copy has passed, at a later call
that needs them (or when enough are on their way to be worth one read).
By then the work queued before the free is done, so a read page needs no
release fence of its own. A CPU tensor's slots are copied at once and
land at once: every tensor free takes the same way.

Copies queued in a row on one stream share one event, recorded after the
last of them (RunMarks): a stream runs its copies in order, so the event
passing says each of them landed, and a free costs a copy launch rather
than a copy and an event record.

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
# Copies in a row on one stream that share one event: half a read batch,
# so that a read finds the run before the newest landed.
RUN_LENGTH = READ_BATCH // 2
# Slots a pinned ring holds (per dtype; 1 MiB of int64).
RING_SLOTS = 1 << 17


class _Free:
    """One queued free: its copy (`host`, a NumPy array), the mark of the
    copy's run (None: landed at once) and the ring it lies in (None: memory
    of its own)."""

    __slots__ = ("number", "host", "mark", "ring")

    def __init__(self, number, host, mark, ring):
        self.number = number
        self.host = host
        self.mark = mark
        self.ring = ring


class _Mark:
    """A run of copies queued in a row on one stream: the event recorded
    after its last copy (None while the run is open, and once the event is
    reused), and whether the event is known to have passed."""

    __slots__ = ("event", "passed")

    def __init__(self):
        self.event = None
        self.passed = False


class RunMarks:
    """Marks of copies queued on streams, one event to a run: copies in a
    row on one stream, at most `run_length` of them. A run closes (its
    event is recorded on its stream) when it is full, when a copy comes
    on another stream, or when a wait needs it; an event is reused once a
    copy of its run is read (the run has passed). `new_event`: a function
    returning an event (record(stream), query(), synchronize()). Not
    thread-safe."""

    def __init__(self, new_event, run_length):
        self._new_event = new_event
        self._run_length = int(run_length)
        self._spare_events = []
        self._open = None  # the open run's mark
        self._open_stream = None
        self._open_count = 0

    def mark(self, stream):
        """The mark of a copy just queued on `stream`."""
        if self._open is not None and self._open_stream is not stream:
            self.close()
        if self._open is None:
            self._open = _Mark()
            self._open_stream = stream
            self._open_count = 0
        mark = self._open
        self._open_count += 1
        if self._open_count >= self._run_length:
            self.close()
        return mark

    def close(self):
        """Records the open run's event on its stream, after its copies."""
        mark = self._open
        if mark is None:
            return
        event = (self._spare_events.pop() if self._spare_events else
                 self._new_event())
        event.record(self._open_stream)
        mark.event = event
        self._open = self._open_stream = None

    def passed(self, mark, wait):
        """Whether every copy of `mark`'s run has landed (waiting for them,
        and closing the run if it is open, when `wait`)."""
        if mark.passed:
            return True
        if mark.event is None:
            if not wait:
                return False
            self.close()
        if wait:
            mark.event.synchronize()
        elif not mark.event.query():
            return False
        mark.passed = True
        return True

    def give_back(self, mark):
        """A copy of `mark`'s run, which passed, was read: the run's event
        is free for another run."""
        if mark.event is not None:
            self._spare_events.append(mark.event)
            mark.event = None


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

    def cancel(self):
        """Gives back the newest live region (nothing was copied into it)."""
        self._live.pop()
        self._tail = self._live[-1][1] if self._live else 0

    def release(self):
        """Gives back the oldest live region."""
        self._live.popleft()
        if not self._live:
            self._tail = 0


class _PinnedRing:
    """A pinned host buffer of one dtype, its address and NumPy view, and
    the space of its regions."""

    def __init__(self, dtype):
        self.buffer = torch.empty((RING_SLOTS,), dtype=dtype, pin_memory=True)
        self.array = self.buffer.numpy()
        self.address = self.buffer.data_ptr()
        self.space = RingSpace(RING_SLOTS)


class UnreadFrees:
    """Copies of freed slots not yet read, oldest first. Not thread-safe
    (the allocator's). `current_stream`: a function returning the current
    CUDA stream's torch object, where the copies are queued and the events
    recorded (the same object for the same stream: runs are told apart by
    it). `copy`: client.device_to_host_copier()'s function, which queues a
    copy in one call to the library."""

    def __init__(self, current_stream, copy):
        self._current_stream = current_stream
        self._copy = copy
        self._entries = collections.deque()  # of _Free
        self._rings = {}  # dtype -> _PinnedRing
        self._marks = RunMarks(torch.cuda.Event, RUN_LENGTH)
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
            if not values.is_contiguous():
                # On the current stream, as the copy: its memory is not
                # reused before the copy has run.
                values = values.contiguous()
            ring = self._ring(values.dtype)
            start = ring.space.place(count)
            if start is None:
                ring = None
                # Pinned memory of its own, kept (as the array's base)
                # until the free is read, after its copy landed.
                block = torch.empty((count,), dtype=values.dtype,
                                    pin_memory=True)
                host, address = block.numpy(), block.data_ptr()
            else:
                host = ring.array[start:start + count]
                address = ring.address + start * ring.array.itemsize
            stream = self._current_stream()
            try:
                self._copy(values.data_ptr(), count * values.element_size(),
                           address, stream.cuda_stream)
            except BaseException:
                if ring is not None:
                    ring.space.cancel()
                raise
            mark = self._marks.mark(stream)
        else:
            host, mark, ring = values.reshape(-1).clone().numpy(), None, None
        self._added += 1
        self._entries.append(_Free(self._added, host, mark, ring))
        self.slots += count
        return self._added

    def landed(self, wait):
        """How many of the oldest frees have landed, in a row (all of
        them, waiting for each, when `wait`)."""
        entries = self._entries
        while self._landed < len(entries):
            mark = entries[self._landed].mark
            if mark is not None and not self._marks.passed(mark, wait):
                break
            self._landed += 1
        return self._landed

    def joined(self, count):
        """The slots of the oldest `count` frees (landed), joined in order
        as a new host int64 array; they stay queued."""
        parts = [self._entries[i].host for i in range(count)]
        return np.concatenate(parts).astype(np.int64, copy=False)

    def copied(self, count):
        """Whether the oldest `count` frees all came through a copy on a
        stream (CUDA slots): once landed, the work queued before each free
        on that stream is done. A CPU tensor's free landed at once."""
        return all(self._entries[i].mark is not None for i in range(count))

    def drop(self, count):
        """Removes the oldest `count` frees (landed and read)."""
        for _ in range(count):
            self._pop()

    def read(self):
        """(number, slots as a new host int64 array, copied: see copied())
        of the oldest free, removed; it must have landed."""
        entry = self._entries[0]
        slots = np.array(entry.host, dtype=np.int64)
        copied = entry.mark is not None
        self._pop()
        return entry.number, slots, copied

    def _pop(self):
        if not self._landed:
            raise AssertionError("read before its copy landed")
        entry = self._entries.popleft()
        self._landed -= 1
        self.slots -= entry.host.size
        if entry.mark is not None:
            self._marks.give_back(entry.mark)
        if entry.ring is not None:
            entry.ring.space.release()

    def _ring(self, dtype):
        ring = self._rings.get(dtype)
        if ring is None:
            ring = self._rings[dtype] = _PinnedRing(dtype)
        return ring
