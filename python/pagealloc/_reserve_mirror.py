"""The top of a session's page reserve, mirrored on the allocator's device.

SGLang's own ``alloc(need_size)`` slices a free-page tensor that lives on
the GPU: a few microseconds and no copy. A take from the session's reserve
(client/page_reserve.h) gives page ids on the host, and handing their
slots to the scheduler as a CUDA tensor costs a host-to-device copy per
call, several times SGLang's whole call. The mirror keeps the slots of the
reserve's next pages (``PageReserve.peek``, top first) in one tensor on the
device, written by one copy; a take whose pages are the mirror's next is
then answered with a slice of it.

The pages stay in the reserve until taken, so its thread may still give
them to a starving session or back to the pool: the mirror is only a
guess of what the next take returns, checked against the pages the take
actually returned (on the host, before anything is handed out). A miss
(the reserve's thread returned them, another take came between) answers
None and the allocator copies the slots as before. Pages put back on top
go before the mirror (``prepend``), their slots on the device joined to it
without a host-to-device copy when the caller has them there.
"""

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


class ReserveMirror:
    """The reserve's next pages with their slots on the device. Not
    thread-safe (the allocator's, as SGLang's allocator is the scheduler
    thread's).

    `to_device(slots)`: host int64 slots (a new array the mirror never
    writes again) as the caller's result type on the device. `concat(a,
    b)`: two such values joined (torch.cat, np.concatenate). Every result
    ``take`` returns is a slice of one such value, which no later call
    writes into."""

    def __init__(self, page_size, to_device, concat, max_pages):
        if max_pages < 1:
            raise ValueError("max_pages (%d) must be >= 1" % max_pages)
        self._page_size = int(page_size)
        self._offsets = np.arange(self._page_size, dtype=np.int64)
        self._to_device = to_device
        self._concat = concat
        self.max_pages = int(max_pages)
        self._pages = _EMPTY  # page ids, the mirror's from _next on
        self._slots = None    # their slots on the device
        self._next = 0
        self.hits = 0
        self.misses = 0

    def __len__(self):
        return self._pages.size - self._next

    def invalidate(self):
        """Forgets the mirror (the reserve's top changed another way)."""
        self._pages, self._slots, self._next = _EMPTY, None, 0

    def refresh(self, pages):
        """Mirrors `pages`: the reserve's top, the next taken first (one
        copy to the device)."""
        pages = np.array(pages[:self.max_pages], dtype=np.int64)
        if pages.size == 0:
            self.invalidate()
            return
        self._pages, self._next = pages, 0
        self._slots = self._to_device(self._slots_of(pages))

    def take(self, pages):
        """The slots of `pages`, just taken from the reserve, as a slice
        of the device tensor when they are the mirror's next pages; else
        None, and the mirror is forgotten."""
        start = self._next
        end = start + pages.size
        if end > self._pages.size or not (
                self._pages[start:end] == pages).all():
            self.invalidate()
            self.misses += 1
            return None
        self._next = end
        self.hits += 1
        ps = self._page_size
        return self._slots[start * ps:end * ps]

    def prepend(self, pages, slots=None):
        """`pages` went on the reserve's top (the first taken next): they go
        before the mirror. `slots`: their slots already on the device, page
        after page (joined without a copy from the host), or None. Past
        max_pages the mirror's tail is dropped."""
        rest = self._pages[self._next:]
        if slots is None:
            self.refresh(np.concatenate((pages, rest)))
            return
        ps = self._page_size
        keep = min(rest.size, max(0, self.max_pages - pages.size))
        start = self._next * ps
        # The join is a copy: the mirror never aliases the caller's tensor,
        # which it may write again (a row of req_to_token).
        tail = (self._slots[start:start + keep * ps] if keep
                else slots[:0])
        self._pages = np.concatenate((pages, rest[:keep]))
        self._slots = self._concat(slots, tail)
        self._next = 0

    def _slots_of(self, pages):
        if self._page_size == 1:
            return pages.copy()
        return (pages[:, None] * self._page_size + self._offsets).reshape(-1)
