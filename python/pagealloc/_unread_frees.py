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
too many are on their way). By then the work queued before the free is
done, so a read page is past its release fence too. A CPU tensor's slots
are copied at once and land at once: every tensor free takes the same way.
"""

import collections

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover - depends on the host
    torch = None

# Frees on their way at most: the next waits for the oldest to land.
MAX_UNREAD = 64


class UnreadFrees:
    """Copies of freed slots not yet read, oldest first. Not thread-safe
    (the allocator's). `current_stream`: a function returning the current
    CUDA stream's torch object, where the events are recorded."""

    def __init__(self, current_stream):
        self._current_stream = current_stream
        # (number, host tensor, event or None: landed)
        self._entries = collections.deque()
        self._spare_events = []
        self._added = 0
        self.slots = 0  # in the entries

    def __len__(self):
        return len(self._entries)

    def add(self, values):
        """Queues the copy of `values` (an integer tensor): a CUDA tensor's
        into pinned host memory on the current stream, a CPU tensor's now.
        Returns the free's number, which pop_landed returns with it."""
        if values.is_cuda:
            host = torch.empty((values.numel(),), dtype=values.dtype,
                               pin_memory=True)
            # The caching host allocator keeps the block until the copy
            # has run (it records the stream's use of it).
            host.copy_(values.reshape(-1), non_blocking=True)
            event = (self._spare_events.pop() if self._spare_events else
                     torch.cuda.Event())
            event.record(self._current_stream())
        else:
            host, event = values.reshape(-1).clone(), None
        self._added += 1
        self._entries.append((self._added, host, event))
        self.slots += host.numel()
        return self._added

    def pop_landed(self, wait):
        """(number, slots as a new host int64 array) of the oldest free
        once its copy has landed (waiting for it when `wait`), or None when
        there is none or it has not landed."""
        if not self._entries:
            return None
        number, host, event = self._entries[0]
        if event is not None:
            if not event.query():
                if not wait:
                    return None
                event.synchronize()
            self._spare_events.append(event)
        self._entries.popleft()
        self.slots -= host.numel()
        return number, np.array(host.numpy(), dtype=np.int64)
