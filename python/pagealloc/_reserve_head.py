"""The head of the token allocator's free list, taken from the session's
reserve ahead of need, with its slots on the allocator's device.

SGLang's token allocator (page size 1) answers ``alloc(need_size)`` with a
slice of a free-slot tensor on the GPU and nothing else. A take from the
session's reserve (client/page_reserve.h) is a library call, and the device
mirror of the reserve's top (_reserve_mirror.py) must check each take's
pages against its guess, since the reserve's thread may return them or
another call push pages on top. The head instead holds its pages: they
are taken from the reserve in one batch, in the reserve's order, so
nothing but this allocator moves them, and an alloc is a slice of the
head's device tensor.

The allocator records which pages it handed out (its `_taken`) when it
next reads that record, not per alloc: the pages a run of takes handed out
are one range of the head's (`unmarked`), marked in one write, so the
step's alloc moves a cursor and nothing else.

The pages in the head are the session's in the daemon's books and handed
out in the reserve's: the reserve's thread cannot give them to a starving
session. The head is bounded (``max_pages``, the allocator's mirror_pages)
and goes back to the reserve whenever the reserve closes, as the pages the
allocator holds back for SGLang's merge do.
"""

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


class ReserveHead:
    """Pages taken from the reserve, the next handed out first. Not
    thread-safe (the allocator's, as SGLang's allocator is the scheduler
    thread's).

    `to_device(slots)`: host int64 slots (a new array the head never writes
    again) as the caller's result type on the device. `concat(a, b)`: two
    such values joined (torch.cat, np.concatenate). Every slice ``take``
    returns is of one such value, which no later call writes into."""

    def __init__(self, to_device, concat, max_pages):
        if max_pages < 1:
            raise ValueError("max_pages (%d) must be >= 1" % max_pages)
        self._to_device = to_device
        self._concat = concat
        self.max_pages = int(max_pages)
        self._pages = _EMPTY  # page ids (== slots at page size 1)
        self._slots = None    # the same on the device
        self._next = 0
        # Handed out but not yet reported by unmarked(): the head's pages
        # from _marked to _next, and those of arrays it no longer holds.
        self._marked = 0
        self._unmarked = []
        self.takes = 0   # every take
        self.misses = 0  # the allocator's: takes it filled the head for

    @property
    def hits(self):
        """Takes the head answered as it stood."""
        return self.takes - self.misses

    def __len__(self):
        return self._pages.size - self._next

    def take(self, n):
        """The device slots of the head's next `n` pages (a slice), or None
        when `n` is not in [1, len(self)]: the step's alloc in one call."""
        start = self._next
        end = start + n
        if n <= 0 or end > self._pages.size:
            return None
        self._next = end
        self.takes += 1
        return self._slots[start:end]

    def unmarked(self):
        """The pages handed out since the last call of this, in the order
        they were taken (None when there are none)."""
        if self._marked == self._next and not self._unmarked:
            return None
        self._keep_unmarked()
        out = (self._unmarked[0] if len(self._unmarked) == 1 else
               np.concatenate(self._unmarked))
        self._unmarked = []
        return out

    def _keep_unmarked(self):
        """Moves the handed-out range not yet reported into _unmarked,
        before the head's arrays are replaced."""
        if self._next > self._marked:
            self._unmarked.append(self._pages[self._marked:self._next])
        self._marked = self._next

    def extend(self, pages):
        """Appends `pages`, just taken from the reserve in its order, behind
        the head's own (one copy to the device; the rest of the head's
        slots joined on the device)."""
        self._keep_unmarked()
        pages = np.array(pages, dtype=np.int64)
        rest = self._pages[self._next:]
        added = self._to_device(pages.copy())
        if rest.size:
            added = self._concat(self._slots[self._next:], added)
            pages = np.concatenate((rest, pages))
        self._pages, self._slots, self._next = pages, added, 0
        self._marked = 0

    def drain(self):
        """Empties the head; returns its pages, the next first, for the
        reserve to take back (those handed out stay for unmarked())."""
        self._keep_unmarked()
        rest = self._pages[self._next:].copy()
        self._pages, self._slots, self._next = _EMPTY, None, 0
        self._marked = 0
        return rest
