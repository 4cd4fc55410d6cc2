"""A NumPy re-statement of SGLang's KV-cache index allocators.

This is the project's own statement, written from reading SGLang's
``python/sglang/srt/mem_cache/allocator.py``: ``PagedTokenToKVPoolAllocator``
(page_size > 1) and ``TokenToKVPoolAllocator`` (page_size 1), on the host, in
NumPy. It is the reference the ``pagealloc.sglang`` drop-in and the daemon
(``--semantics=sglang``) are compared with slot for slot and free list for
free list; it is not used to allocate anything.

What it states, as SGLang does it:

* The free list starts as pages ``1 .. num_pages`` (page 0 is padding).
* ``alloc_extend`` / ``alloc_decode`` write each request's slots as SGLang's
  kernels do (the rest of the prefix's partial page from ``last_loc + 1``,
  then whole new pages, then a partial last page), taking new pages from the
  front of the free list in request order. The batch is all or nothing:
  when the pages it needs exceed the free list, it returns ``None`` and the
  free list is as it was (apart from a merge, below).
* With ``need_sort``, freed pages are parked (``release_pages``) and merged
  into the free list, sorted, when an over-estimate says so, also when the
  batch would fit: ``alloc_extend`` when ``extend_num_tokens // page_size +
  batch_size + 1 > len(free_pages)``, ``alloc_decode`` when ``batch_size >
  len(free_pages)``, ``alloc`` when the pages it needs exceed it.
* The paged ``free`` puts back the distinct pages of the slots, ascending
  (``torch.unique``), at the front of the free list (or of the parked list);
  ``free_segment`` puts back one page per page of a sequence's segment, in
  the segment's order. The token allocator's ``free`` appends the slots as
  given (FIFO reuse), to the free list or the parked list.
* ``free_group_begin`` / ``free_group_end`` collect frees and free them as one
  call; ``backup_state`` returns a value that ``restore_state`` restores, as
  often as wanted; ``clear`` starts over.

SGLang's current page-aligned contract (``allocator/base.py``'s
``uses_legacy_real_length_alloc``, ``allocator/paged.py``, ``allocator/
token.py``; its tests ``test_allocator_page_aligned_free.py``,
``test_allocator_oot_contract.py``, ``test_allocator_lazy_free.py``), with
``page_aligned_free=True``:

* The paged ``free`` takes complete page blocks only (``numel`` a multiple of
  ``page_size``; anything else is refused before any change, also inside a
  free group) and puts back one page per block, ``free_index[::page_size] //
  page_size``, in the order given (no sort). ``free_page_ids`` frees pages
  by id the same way; at page size 1 it is ``free``. ``free_segment`` takes
  a page-aligned start and is the ``free`` of the segment's pages.
* The token allocator's lazy free (freed slots staged until an ``alloc``
  finds the free list short) hands out the same slots as its eager append,
  so the model states the append.

SGLang's debug checks (alignment of ``last_loc``, unique outputs) are not
restated: a caller of this model is expected to pass what SGLang's scheduler
passes. Where SGLang's kernel reads past the free list before it returns
``None``, the model returns ``None`` without reading.
"""

import numpy as np

__all__ = [
    "PagedAllocatorModel",
    "TokenAllocatorModel",
    "make_allocator_model",
]

_EMPTY = np.zeros(0, dtype=np.int64)


def _as_int64(values):
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _ceil_div(a, b):
    return (a + b - 1) // b


class _Base:
    """What both allocators share: the two lists, groups, states."""

    def __init__(self, page_size, num_pages, need_sort):
        self.page_aligned_free = False
        self.page_size = int(page_size)
        self.num_pages = int(num_pages)
        self.need_sort = bool(need_sort)
        self.clear()

    def clear(self):
        self.free_pages = np.arange(1, self.num_pages + 1, dtype=np.int64)
        self.release_pages = _EMPTY.copy()
        self.is_not_in_free_group = True
        self.free_group = []

    def available_size(self):
        return (len(self.free_pages) + len(self.release_pages)) * self.page_size

    def backup_state(self):
        # NumPy slicing and concatenation make new arrays, so the saved
        # arrays are never changed in place: a state can be restored twice.
        return (self.free_pages, self.release_pages)

    def restore_state(self, state):
        self.free_pages, self.release_pages = state

    def free_group_begin(self):
        self.is_not_in_free_group = False
        self.free_group = []

    def free_group_end(self):
        self.is_not_in_free_group = True
        if self.free_group:
            self.free(np.concatenate(self.free_group))

    def merge_and_sort_free(self):
        if len(self.release_pages) > 0:
            self.free_pages = np.sort(
                np.concatenate((self.free_pages, self.release_pages)))
            self.release_pages = _EMPTY.copy()

    def _take(self, count):
        taken = self.free_pages[:count]
        self.free_pages = self.free_pages[count:]
        return taken


class TokenAllocatorModel(_Base):
    """SGLang's TokenToKVPoolAllocator: page_size 1, slot == page.

    SGLang's scheduler allocates an extend's tokens with alloc(extend_num_
    tokens) and a decode batch's with alloc(batch_size) at page size 1;
    this allocator has no alloc_extend / alloc_decode.
    """

    def __init__(self, size, need_sort=False):
        super().__init__(1, size, need_sort)

    def available_size(self):
        return len(self.free_pages) + len(self.release_pages)

    def alloc(self, need_size):
        need_size = int(need_size)
        if self.need_sort and need_size > len(self.free_pages):
            self.merge_and_sort_free()
        if need_size > len(self.free_pages):
            return None
        return self._take(need_size)

    def free(self, free_index):
        free_index = _as_int64(free_index)
        if free_index.size == 0:
            return
        if not self.is_not_in_free_group:
            self.free_group.append(free_index)
        elif self.need_sort:
            self.release_pages = np.concatenate((self.release_pages, free_index))
        else:
            self.free_pages = np.concatenate((self.free_pages, free_index))

    def free_segment(self, free_index, start_pos=0):
        # Token == page: nothing to deduplicate, the plain free is exact.
        self.free(free_index)

    def free_page_ids(self, page_ids):
        # Page size 1: page ids are slots.
        self.free(page_ids)

    def alloc_extend(self, *args, **kwargs):
        raise NotImplementedError("alloc_extend is only for paged allocator")

    def alloc_decode(self, *args, **kwargs):
        raise NotImplementedError("alloc_decode is only for paged allocator")


class PagedAllocatorModel(_Base):
    """SGLang's PagedTokenToKVPoolAllocator."""

    def __init__(self, size, page_size, need_sort=False,
                 page_aligned_free=False):
        super().__init__(page_size, int(size) // int(page_size), need_sort)
        self.size = int(size)
        # SGLang's current free (complete page blocks, in order) instead of
        # its legacy one (the distinct pages, ascending).
        self.page_aligned_free = bool(page_aligned_free)

    def alloc(self, need_size):
        num_pages = int(need_size) // self.page_size
        if self.need_sort and num_pages > len(self.free_pages):
            self.merge_and_sort_free()
        if num_pages > len(self.free_pages):
            return None
        pages = self._take(num_pages)
        return (pages[:, None] * self.page_size +
                np.arange(self.page_size, dtype=np.int64)).reshape(-1)

    def _write_extend(self, prefix_lens, seq_lens, last_loc):
        """The kernel's slots for a batch, reading the free list's front."""
        ps = self.page_size
        extend_lens = seq_lens - prefix_lens
        out = np.empty(int(extend_lens.sum()), dtype=np.int64)
        new_pages = _ceil_div(seq_lens, ps) - _ceil_div(prefix_lens, ps)
        first_page = np.cumsum(new_pages) - new_pages
        at = 0
        for i in range(len(seq_lens)):
            prefix, seq, last = int(prefix_lens[i]), int(seq_lens[i]), int(
                last_loc[i])
            # The rest of the prefix's partial page.
            part1 = min(seq, _ceil_div(prefix, ps) * ps) - prefix
            out[at:at + part1] = last + 1 + np.arange(part1)
            at += part1
            # Whole new pages, then a partial last one.
            page = int(first_page[i])
            for position in range(prefix + part1, seq, ps):
                count = min(ps, seq - position)
                out[at:at + count] = (self.free_pages[page] * ps +
                                      np.arange(count))
                at += count
                page += 1
        return out

    def alloc_extend(self,
                     prefix_lens,
                     seq_lens,
                     last_loc,
                     extend_num_tokens=None,
                     prefix_lens_cpu=None,
                     seq_lens_cpu=None):
        """SGLang's alloc_extend. The *_cpu copies, when given, must equal
        the arrays (SGLang uses them for its page count); extend_num_tokens
        defaults to the sum of the extends."""
        prefix_lens = _as_int64(prefix_lens)
        seq_lens = _as_int64(seq_lens)
        last_loc = _as_int64(last_loc)
        for copy, array in ((prefix_lens_cpu, prefix_lens), (seq_lens_cpu,
                                                               seq_lens)):
            if copy is not None and not np.array_equal(_as_int64(copy), array):
                raise ValueError("a *_cpu copy differs from its array")
        if extend_num_tokens is None:
            extend_num_tokens = int((seq_lens - prefix_lens).sum())
        bs = len(prefix_lens)
        ps = self.page_size
        if self.need_sort and (int(extend_num_tokens) // ps + bs + 1 >
                               len(self.free_pages)):
            self.merge_and_sort_free()
        num_new_pages = int((_ceil_div(seq_lens, ps) -
                             _ceil_div(prefix_lens, ps)).sum())
        if num_new_pages > len(self.free_pages):
            return None
        out = self._write_extend(prefix_lens, seq_lens, last_loc)
        self.free_pages = self.free_pages[num_new_pages:]
        return out

    def alloc_decode(self, seq_lens, last_loc, seq_lens_cpu=None):
        """SGLang's alloc_decode: seq_lens count the new token."""
        seq_lens = _as_int64(seq_lens)
        last_loc = _as_int64(last_loc)
        if seq_lens_cpu is not None and not np.array_equal(
                _as_int64(seq_lens_cpu), seq_lens):
            raise ValueError("seq_lens_cpu differs from seq_lens")
        bs = len(seq_lens)
        if self.need_sort and bs > len(self.free_pages):
            self.merge_and_sort_free()
        ps = self.page_size
        new_pages = _ceil_div(seq_lens, ps) - _ceil_div(seq_lens - 1, ps)
        num_new_pages = int(new_pages.sum())
        if num_new_pages > len(self.free_pages):
            return None
        first_page = np.cumsum(new_pages) - new_pages
        out = np.empty(bs, dtype=np.int64)
        for i in range(bs):
            if new_pages[i] == 0:
                out[i] = last_loc[i] + 1  # inside the last token's page
            else:
                out[i] = self.free_pages[first_page[i]] * ps
        self.free_pages = self.free_pages[num_new_pages:]
        return out

    def _put_back(self, pages):
        if self.need_sort:
            self.release_pages = np.concatenate((pages, self.release_pages))
        else:
            self.free_pages = np.concatenate((pages, self.free_pages))

    def free(self, free_index):
        free_index = _as_int64(free_index)
        if free_index.size == 0:
            return
        if self.page_aligned_free and free_index.size % self.page_size:
            raise ValueError(
                "free requires complete page blocks: numel=%d, page_size=%d" %
                (free_index.size, self.page_size))
        if not self.is_not_in_free_group:
            self.free_group.append(free_index)
            return
        if self.page_aligned_free:
            self._put_back(free_index[::self.page_size] // self.page_size)
        else:
            self._put_back(np.unique(free_index // self.page_size))

    def free_page_ids(self, page_ids):
        """SGLang's free_page_ids: the pages, in the order given."""
        page_ids = _as_int64(page_ids)
        if page_ids.size == 0:
            return
        self.free(page_ids[:, None] * self.page_size +
                  np.arange(self.page_size, dtype=np.int64))

    def free_segment(self, free_index, start_pos):
        """SGLang's free_segment: `free_index` is kv_row[start_pos : start_pos
        + n] of one request; one slot per page stands for its page, in the
        row's order (no sort)."""
        free_index = _as_int64(free_index)
        if free_index.size == 0:
            return
        ps = self.page_size
        if self.page_aligned_free:
            # SGLang's current free_segment: a page-aligned start, and the
            # free of the segment's pages (the last one whole).
            if int(start_pos) % ps:
                raise ValueError("segment start %d is not page-aligned" %
                                 start_pos)
            pages = free_index[::ps] // ps
            self.free((pages[:, None] * ps +
                       np.arange(ps, dtype=np.int64)).reshape(-1))
            return
        offset = int(start_pos) % ps
        if offset == 0:
            reps = free_index[::ps]
        else:
            reps = np.concatenate((free_index[:1], free_index[ps - offset::ps]))
        if not self.is_not_in_free_group:
            # A group frees its slots with one free() at its end, which
            # sorts; representatives stand for their pages there too.
            self.free_group.append(reps)
            return
        self._put_back(reps // ps)


def make_allocator_model(size, page_size, need_sort=False,
                         page_aligned_free=False):
    """SGLang's choice: the token allocator at page size 1, else the paged
    one. `size` is in tokens; `page_aligned_free`: the paged allocator's
    current free (PagedAllocatorModel)."""
    if int(page_size) == 1:
        return TokenAllocatorModel(size, need_sort)
    return PagedAllocatorModel(size, page_size, need_sort, page_aligned_free)
