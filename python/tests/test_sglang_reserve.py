"""pagealloc.sglang on the session's page reserve (the default).

SGLang's current page-aligned contract, restated in pagealloc.sglang_model
with page_aligned_free=True (from SGLang's allocator/base.py, paged.py,
token.py and its tests test_allocator_page_aligned_free.py,
test_allocator_oot_contract.py, test_allocator_lazy_free.py), compared slot
for slot with the allocator over random traces of alloc, free,
free_page_ids and free groups, one session whose reserve may hold the
whole pool; the reserve's round trips in a steady alloc/free loop; two
sessions sharing one pool through the reclaim protocol; a killed process's
reserve; and frees of slots the allocator never gave out.
"""

import contextlib
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import pagealloc
from pagealloc import sglang
from pagealloc._reserve_head import ReserveHead
from pagealloc.sglang_model import make_allocator_model

import test_sglang
from conftest import wait_until
# The CPU-backend mark, and the fixture that runs every test with and
# without PyTorch's tensors.
from test_sglang import host, pytestmark, results_as  # noqa: F401

TRACE_OPS = int(os.environ.get("PAGEALLOC_SGLANG_TRACE_OPS", "600"))


def start(make_daemon, page_size, num_pages, policy="lifo"):
    return test_sglang.start(make_daemon, page_size, num_pages, policy)


def whole_pool(num_pages):
    """Reserve options under which one session's reserve is the whole pool
    (no refill or return ever moves a page; a short pool is None at once)."""
    return dict(max_pages=num_pages, initial_batch=num_pages, starved_wait=0)


def pages_of(slots, page_size):
    return np.asarray(slots)[::page_size] // page_size


@contextlib.contextmanager
def lone(make_daemon, page_size, num_pages, policy="lifo", **options):
    """An allocator of the only session on a new daemon, its reserve the
    whole pool; `options`: more of make_allocator's."""
    daemon = start(make_daemon, page_size, num_pages, policy)
    with daemon.connect() as client:
        allocator = sglang.make_allocator(
            client, reserve_options=whole_pool(num_pages), **options)
        yield allocator
        allocator.close()


# ------------------------------------------------------- SGLang's contract


def test_capability_attributes():
    for cls in (sglang.PagedTokenToKVPoolAllocator,
                sglang.TokenToKVPoolAllocator):
        assert cls.uses_legacy_real_length_alloc is False
        assert cls.supports_page_aligned_alloc is True
        assert cls.supports_spec_page_aligned_alloc is True


class ContractTrace:
    """A scheduler on SGLang's main path: whole-page allocations, freed
    whole (free), page by page in any order (free_page_ids), as a
    page-aligned tail and its head (free_segment, free), or several in a
    free group; the allocator and the model get the same calls."""

    def __init__(self, allocator, model, page_size, num_pages, rng):
        self.a, self.m = allocator, model
        self.ps, self.num_pages, self.rng = page_size, num_pages, rng
        self.held = []  # allocations as slot lists

    def same(self, got, want, what):
        got = host(got)
        if want is None:
            assert got is None, "%s: model None, allocator %s" % (what, got)
            return
        assert got is not None, "%s: allocator None, model %s" % (what, want)
        np.testing.assert_array_equal(got, want, err_msg=what)
        self.held.append(list(want))

    def op_alloc(self):
        pages = int(self.rng.integers(0, max(2, self.num_pages // 3)))
        self.same(self.a.alloc(pages * self.ps), self.m.alloc(pages * self.ps),
                  "alloc(%d)" % (pages * self.ps))

    def take(self):
        if not self.held:
            return None
        return self.held.pop(int(self.rng.integers(len(self.held))))

    def op_free(self):
        slots = self.take()
        if slots is not None:
            self.a.free(np.array(slots, dtype=np.int64))
            self.m.free(slots)

    def op_free_shuffled(self):
        """Whole pages in a shuffled order: SGLang puts them back in the
        order given, the first the next handed out."""
        slots = self.take()
        if slots is None:
            return
        blocks = np.array(slots, dtype=np.int64).reshape(-1, self.ps)
        self.rng.shuffle(blocks)
        self.a.free(blocks.reshape(-1))
        self.m.free(blocks.reshape(-1))

    def op_free_page_ids(self):
        slots = self.take()
        if slots is None:
            return
        pages = pages_of(slots, self.ps)
        self.rng.shuffle(pages)
        cut = int(self.rng.integers(0, pages.size + 1))
        for part in (pages[:cut], pages[cut:]):
            self.a.free_page_ids(part)
            self.m.free_page_ids(part)

    def op_free_segment(self):
        """A request's row freed as a page-aligned tail (free_segment)
        and its head (free)."""
        slots = self.take()
        if slots is None or not slots:
            return
        row = np.array(slots, dtype=np.int64)
        start = int(self.rng.integers(0, row.size // self.ps)) * self.ps
        self.a.free_segment(row[start:], start_pos=start)
        self.m.free_segment(row[start:], start)
        self.a.free(row[:start])
        self.m.free(row[:start])

    def op_group(self):
        self.a.free_group_begin()
        self.m.free_group_begin()
        ops = [self.op_free, self.op_free_shuffled, self.op_free_page_ids]
        if self.ps > 1:
            ops.append(self.op_free_segment)
        for _ in range(int(self.rng.integers(0, 4))):
            ops[int(self.rng.integers(len(ops)))]()
        self.a.free_group_end()
        self.m.free_group_end()

    # The legacy calls, expanded on the reserve in process: new requests,
    # requests grown from inside their last page, and decode steps. Each
    # request is held as the whole pages it holds, as the page-aligned
    # contract frees them.

    def whole(self, pages):
        return list((np.asarray(pages, dtype=np.int64)[:, None] * self.ps +
                     np.arange(self.ps)).reshape(-1))

    def legacy(self, what, got, want):
        got = host(got)
        if want is None:
            assert got is None, "%s: model None, allocator %s" % (what, got)
            return False
        assert got is not None, "%s: allocator None, model %s" % (what, want)
        np.testing.assert_array_equal(got, want, err_msg=what)
        return True

    def grown(self, held, prefix, seq, last, out):
        """The whole pages of `held` (a request's slots, whole pages; None
        for a new one) with the pages its extend from prefix to seq took."""
        pages = [] if held is None else list(pages_of(held, self.ps))
        for page in np.asarray(out, dtype=np.int64) // self.ps:
            if not pages or pages[-1] != page:
                pages.append(int(page))
        return self.whole(pages)

    def op_extend_new(self):
        bs = int(self.rng.integers(1, 4))
        prefix = np.zeros(bs, dtype=np.int64)
        seq = self.rng.integers(1, 2 * self.ps + 1, size=bs).astype(np.int64)
        last = np.full(bs, -1, dtype=np.int64)
        total = int(seq.sum())
        want = self.m.alloc_extend(prefix, seq, last, total)
        if not self.legacy("alloc_extend(new %s)" % seq.tolist(),
                           self.a.alloc_extend(prefix, prefix, seq, seq, last,
                                               total), want):
            return
        start = 0
        for i in range(bs):
            self.held.append(self.grown(None, 0, seq[i], -1,
                                        want[start:start + seq[i]]))
            start += seq[i]

    def take_request(self):
        """A held allocation of at least one page, or None."""
        held = self.take()
        if held is not None and not held:
            return None
        return held

    def tail(self, held):
        """(prefix, last_loc) of a request that holds `held`: its length
        ends somewhere in its last page."""
        prefix = len(held) - int(self.rng.integers(0, self.ps))
        return prefix, held[prefix - 1]

    def op_extend_more(self):
        held = self.take_request()
        if held is None:
            return
        prefix, last = self.tail(held)
        seq = prefix + int(self.rng.integers(1, 2 * self.ps + 1))
        p, q, l_ = (np.array([v], dtype=np.int64) for v in (prefix, seq, last))
        want = self.m.alloc_extend(p, q, l_, seq - prefix)
        if self.legacy("alloc_extend(%d -> %d)" % (prefix, seq),
                       self.a.alloc_extend(p, p, q, q, l_, seq - prefix),
                       want):
            held = self.grown(held, prefix, seq, last, want)
        self.held.append(held)

    def op_decode(self):
        rows = [r for r in (self.take_request() for _ in range(
            int(self.rng.integers(1, 4)))) if r is not None]
        if not rows:
            return
        tails = [self.tail(r) for r in rows]
        seq = np.array([t[0] + 1 for t in tails], dtype=np.int64)
        last = np.array([t[1] for t in tails], dtype=np.int64)
        want = self.m.alloc_decode(seq, last)
        if self.legacy("alloc_decode(%s)" % seq.tolist(),
                       self.a.alloc_decode(seq, seq, last), want):
            rows = [self.grown(r, seq[i] - 1, seq[i], last[i], want[i:i + 1])
                    for i, r in enumerate(rows)]
        self.held.extend(rows)

    def run(self, ops):
        table = [(self.op_alloc, 6), (self.op_free, 2),
                 (self.op_free_shuffled, 1), (self.op_free_page_ids, 1),
                 (self.op_group, 1)]
        if self.ps > 1:
            table += [(self.op_free_segment, 1), (self.op_extend_new, 2),
                      (self.op_extend_more, 2), (self.op_decode, 3)]
        weights = np.array([w for _, w in table], dtype=float)
        for step in range(ops):
            table[int(self.rng.choice(len(table),
                                      p=weights / weights.sum()))][0]()
            assert self.a.available_size() == self.m.available_size(), step
        while self.held:
            self.op_free()
        self.same(self.a.alloc(self.num_pages * self.ps),
                  self.m.alloc(self.num_pages * self.ps), "the whole pool")


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("policy", ["lifo", "sorted"])
def test_trace_matches_sglangs_current_contract(make_daemon, page_size,
                                                policy):
    # At page size 1 the pool is large enough for the allocator to merge
    # the frees it holds back before an alloc finds the list short.
    num_pages = 512 if page_size == 1 else 48
    daemon = start(make_daemon, page_size, num_pages, policy)
    with daemon.connect() as client:
        allocator = sglang.make_allocator(
            client, reserve_options=whole_pool(num_pages))
        model = make_allocator_model(num_pages * page_size, page_size,
                                     need_sort=policy == "sorted",
                                     page_aligned_free=True)
        rng = np.random.default_rng(1000 * page_size + len(policy))
        ContractTrace(allocator, model, page_size, num_pages,
                      rng).run(TRACE_OPS)
        allocator.close()


def test_alloc_is_whole_pages_in_order_and_none_when_short(make_daemon):
    with lone(make_daemon, 16, 8) as allocator:
        out = host(allocator.alloc(32))
        np.testing.assert_array_equal(out, np.arange(16, 48))
        before = allocator.available_size()
        assert allocator.alloc(16 * 7) is None  # 6 pages left
        assert allocator.available_size() == before
        # need_size is floored to whole pages, as SGLang's paged alloc does
        # outside its debug mode.
        assert host(allocator.alloc(20)).tolist() == list(range(48, 64))


def test_paged_free_puts_pages_back_in_the_order_given(make_daemon):
    with lone(make_daemon, 4, 4) as allocator:
        out = host(allocator.alloc(8))  # pages 1, 2
        allocator.free(np.concatenate((out[4:], out[:4])))
        assert pages_of(host(allocator.alloc(16)), 4).tolist() == [2, 1, 3, 4]


def test_free_segment_puts_the_segments_pages_back_in_order(make_daemon):
    with lone(make_daemon, 4, 8) as allocator:
        row = host(allocator.alloc(12))  # pages 1, 2, 3
        allocator.free_group_begin()
        allocator.free(host(allocator.alloc(4)))  # page 4
        allocator.free_segment(row[4:], start_pos=4)  # pages 2, 3
        allocator.free_group_end()
        # The group's slots first, then the segment's pages, in order.
        assert pages_of(host(allocator.alloc(12)), 4).tolist() == [4, 2, 3]
        allocator.free_segment(row[:4], start_pos=0)
        assert pages_of(host(allocator.alloc(4)), 4).tolist() == [1]


def test_sorted_policy_parks_frees_until_the_free_list_is_short(make_daemon):
    with lone(make_daemon, 4, 4, "sorted") as allocator:
        out = host(allocator.alloc(8))  # pages 1, 2
        allocator.free(out[4:])
        allocator.free(out[:4])
        assert allocator.available_size() == 16
        # Pages 3, 4 are still free: the parked pages wait.
        assert pages_of(host(allocator.alloc(8)), 4).tolist() == [3, 4]
        assert pages_of(host(allocator.alloc(8)), 4).tolist() == [1, 2]


def test_token_allocator_queues_frees_behind_its_free_list(make_daemon):
    with lone(make_daemon, 1, 6) as allocator:
        first = host(allocator.alloc(2))
        assert first.tolist() == [1, 2]
        allocator.free(first[::-1])
        assert host(allocator.alloc(4)).tolist() == [3, 4, 5, 6]
        assert host(allocator.alloc(2)).tolist() == [2, 1]


# ------------------------------------------------------------ round trips


@pytest.mark.parametrize("page_size,need_size", [(1, 256), (16, 256)])
def test_steady_state_makes_no_synchronous_refill(make_daemon, page_size,
                                                  need_size):
    # The default reserve (a quarter of the pool at most) is enough for
    # one allocation, so after the first Take the loop never finds it
    # short, whatever the reserve's thread does meanwhile.
    daemon = start(make_daemon, page_size, 4096 // page_size * 4)
    with daemon.connect() as client:
        allocator = sglang.make_allocator(client)
        for _ in range(8):  # warm-up
            allocator.free(allocator.alloc(need_size))
        warm = allocator.reserve.stats()
        mirror = allocator.mirror_stats
        for _ in range(200):
            out = allocator.alloc(need_size)
            assert out is not None and len(out) == need_size
            allocator.free(out)
        stats = allocator.reserve.stats()
        assert stats["sync_refills"] == warm["sync_refills"] <= 1
        if page_size > 1:
            # (The token allocator's head answers a call without a take:
            # test_the_token_allocators_head_is_sliced_without_a_take.)
            assert stats["takes"] >= warm["takes"] + 200  # merges take too
        if pagealloc._native.HAS_RESERVE_PEEK:
            # Paged: the freed pages go back on the reserve's top and
            # before the mirror. Token allocator: its frees queue behind
            # the free list, the mirror's pages stay the next. Either way
            # the next take is the mirror's next pages whenever the
            # reserve's thread did not refill on top in between.
            hits = allocator.mirror_stats["hits"] - mirror["hits"]
            misses = allocator.mirror_stats["misses"] - mirror["misses"]
            assert hits + misses == 200
            if page_size > 1:
                # The token allocator's head fills from half of what the
                # reserve holds at a miss, which its thread's timing
                # decides (on CI's loaded 2 cores: too little for a hit in
                # 200 steps once); its hits are checked in
                # test_the_token_allocators_head_is_sliced_without_a_take.
                assert hits > 0
        # A refill the reserve's thread has in flight is in neither count.
        wait_until(lambda: allocator.available_size() == client.pool.num_pages
                   * page_size, what="every page to count as available")
        allocator.close()


def test_use_reserve_false_is_the_thin_path(make_daemon):
    daemon = start(make_daemon, 4, 16)
    with daemon.connect() as client:
        allocator = sglang.make_allocator(client, use_reserve=False)
        assert allocator.reserve is None
        out = host(allocator.alloc(8))
        assert client.stats().used_pages == 2
        allocator.free(out)
        assert client.stats().used_pages == 0
        allocator.close()


def test_legacy_calls_take_their_pages_from_the_reserve(make_daemon):
    """alloc_extend and alloc_decode (SGLang's legacy path) expand on the
    reserve in this process: no call to the daemon, the reserve's pages
    handed out, and a free of the requests' whole pages puts them back."""
    with lone(make_daemon, 4, 8) as allocator:
        stats = allocator.client.stats()
        assert allocator.reserve.stats()["pages"] == 8
        # (Filling the reserve with the pool may have refilled on this
        # thread once, when its own thread had not started yet.)
        refills = allocator.reserve.stats()["sync_refills"]
        prefix = np.zeros(4, dtype=np.int64)
        seq = np.full(4, 3, dtype=np.int64)  # three slots of a page each
        last = np.full(4, -1, dtype=np.int64)
        out = host(allocator.alloc_extend(prefix, prefix, seq, seq, last, 12))
        assert out is not None and len(np.unique(out // 4)) == 4
        # A decode step continues each request's page, then the next one
        # starts a page each.
        step = host(allocator.alloc_decode(seq + 1, seq + 1, out[2::3]))
        np.testing.assert_array_equal(step, out[2::3] + 1)
        assert allocator.reserve.stats()["pages"] == 4
        step = host(allocator.alloc_decode(seq + 2, seq + 2, step))
        assert len(np.unique(step // 4)) == 4
        assert allocator.reserve.stats()["pages"] == 0
        # The daemon allocated nothing: the reserve held the pages (its
        # thread's refills of an empty pool are refused).
        after = allocator.client.stats()
        assert after.slots_allocated_total == stats.slots_allocated_total
        assert allocator.reserve.stats()["sync_refills"] == refills
        # The requests' whole pages go back into the reserve.
        pages = np.unique(np.concatenate((out, step)) // 4)
        allocator.free((pages[:, None] * 4 + np.arange(4)).reshape(-1))
        assert allocator.reserve.stats()["pages"] == 8
        assert allocator.available_size() == 32
        # A batch the pool cannot hold: SGLang's None, nothing taken.
        nine = np.full(9, 4, dtype=np.int64)
        zeros = np.zeros(9, dtype=np.int64)
        assert allocator.alloc_extend(zeros, zeros, nine, nine,
                                      np.full(9, -1, dtype=np.int64),
                                      36) is None
        assert allocator.available_size() == 32


def test_a_legacy_call_the_daemon_serves_gets_the_whole_pool(make_daemon):
    """A legacy call the daemon serves (a host last_loc that continues a
    page the reserve did not hand out: the daemon checks whose it is) gets
    the whole pool, the reserve's pages among it."""
    daemon = start(make_daemon, 4, 8)
    with daemon.connect() as client:
        # A page of the session from the daemon itself, outside the reserve.
        own = client.alloc_extend([0], [2], [-1])
        base = int(np.asarray(own.slots)[0])
        client.release(own)
        allocator = sglang.make_allocator(client,
                                          reserve_options=whole_pool(8))
        prefix = np.array([2], dtype=np.int64)
        seq = np.array([4 * 7 + 2], dtype=np.int64)  # the rest of the pool
        last = np.array([base + 1], dtype=np.int64)
        out = host(allocator.alloc_extend(prefix, prefix, seq, seq, last, 28))
        assert out is not None and out[0] == base + 2
        assert len(np.unique(out // 4)) == 8
        allocator.free(np.concatenate(([base, base + 1], out)))
        assert allocator.available_size() == 32
        # The next alloc has the reserve again.
        assert len(host(allocator.alloc(32))) == 32
        assert allocator.reserve is not None
        allocator.close()


# ------------------------------------------------------- the device mirror

needs_peek = pytest.mark.skipif(
    not pagealloc._native.HAS_RESERVE_PEEK,
    reason="the library has no pagealloc_reserve_peek (ABI 1.6)")


def mirror_trace(allocator, rng, steps):
    """A decode loop's calls: whole-page allocations of 1-8 pages and frees
    of random earlier ones. Returns every allocation's slots, in order."""
    ps = allocator.page_size
    live, seen = [], []
    for _ in range(steps):
        if live and rng.random() < 0.45:
            allocator.free(live.pop(int(rng.integers(len(live)))))
            continue
        out = allocator.alloc(int(rng.integers(1, 9)) * ps)
        if out is None:
            continue
        seen.append(host(out).copy())
        live.append(out)
    return seen


@needs_peek
@pytest.mark.parametrize("page_size", [4, 16])
def test_mirrored_slots_are_the_reserves_slot_for_slot(make_daemon,
                                                       page_size):
    """The device mirror answers most allocations of a steady loop with a
    slice, and every answer is the slots of the pages the reserve handed
    out: the same trace without a mirror gives the same slots."""
    runs = []
    for mirror_pages in (None, 0):
        with lone(make_daemon, page_size, 256,
                  mirror_pages=mirror_pages) as allocator:
            seen = mirror_trace(allocator, np.random.default_rng(7), 400)
            runs.append((seen, allocator.mirror_stats))
    (mirrored, stats), (copied, _) = runs
    assert len(mirrored) == len(copied) > 100
    for a, b in zip(mirrored, copied):
        np.testing.assert_array_equal(a, b)
    assert stats["hits"] > stats["misses"]


@needs_peek
def test_a_stale_mirror_gives_the_pages_taken(make_daemon):
    """A take the mirror did not foresee (here the reserve's top taken
    behind the allocator's back, as a refill by the reserve's thread would
    change it) answers the slots of the pages the reserve handed out, not
    the mirror's."""
    with lone(make_daemon, 4, 64) as allocator:
        first = host(allocator.alloc(8))
        assert allocator.mirror_stats["pages"] > 0
        hits = allocator.mirror_stats["hits"]
        stolen = allocator.reserve.take(3)  # the mirror's next three
        expected = allocator.reserve.peek(2)
        out = host(allocator.alloc(8))
        np.testing.assert_array_equal(
            out, (expected[:, None] * 4 + np.arange(4)).reshape(-1))
        assert not set(expected.tolist()) & set(stolen.tolist())
        assert allocator.mirror_stats["misses"] >= 1
        assert allocator.mirror_stats["hits"] == hits
        allocator.reserve.put(stolen)
        allocator.free(first)
        allocator.free(out)
        assert allocator.available_size() == 64 * 4


@needs_peek
def test_the_mirror_keeps_no_view_of_a_freed_tensor(make_daemon,
                                                    results_as):
    """Freed slots join the mirror as a copy: the caller writing into the
    tensor it freed (a row of req_to_token reused) changes nothing."""
    with lone(make_daemon, 4, 64) as allocator:
        out = allocator.alloc(16)
        freed = out.clone() if hasattr(out, "clone") else np.array(out)
        allocator.free(freed)
        freed[:] = 0
        again = host(allocator.alloc(16))
        np.testing.assert_array_equal(again, host(out))
        assert allocator.mirror_stats["hits"] >= 1


# ------------------------------------------- the token allocator's head


def test_the_token_allocators_head_is_sliced_without_a_take(make_daemon,
                                                            results_as):
    """At page size 1 an alloc the head holds is a slice of it: no take
    from the reserve, the free list's next slots in order (SGLang's). The
    head's pages count as available and go back with the reserve; a free
    of one never given out is refused and changes nothing."""
    with lone(make_daemon, 1, 64, mirror_pages=16) as allocator:
        first = host(allocator.alloc(4))
        assert first.tolist() == [1, 2, 3, 4]
        assert allocator.mirror_stats == dict(pages=12, hits=0, misses=1)
        takes = allocator.reserve.stats()["takes"]
        assert host(allocator.alloc(3)).tolist() == [5, 6, 7]
        assert host(allocator.alloc(5)).tolist() == [8, 9, 10, 11, 12]
        assert allocator.reserve.stats()["takes"] == takes
        assert allocator.mirror_stats == dict(pages=4, hits=2, misses=1)
        assert allocator.available_size() == 64 - 12
        # Page 13 is the head's next, never given out: the daemon refuses
        # it (the head and the reserve go back to the pool first).
        with pytest.raises(pagealloc.PageallocError):
            allocator.free_page_ids([13])
        assert allocator.mirror_stats["pages"] == 0
        assert allocator.available_size() == 64 - 12
        assert allocator.client.stats().used_pages == 12
        # The call the head cannot serve takes the rest and fills it up.
        allocator.free(first)
        out = host(allocator.alloc(6))
        assert len(out) == 6 and not set(out.tolist()) & set(range(5, 13))
        assert allocator.mirror_stats["pages"] == 16 - 6
        assert allocator.available_size() == 64 - 14
        # A checkpoint gives the reserve back to the daemon, the head too.
        allocator.backup_state()
        assert allocator.mirror_stats["pages"] == 0
        assert allocator.client.stats().used_pages == 14
        assert allocator.available_size() == 64 - 14


def test_the_heads_handed_out_pages_are_reported_once_across_refills():
    """The head reports the pages it handed out (for the allocator's
    record) once each, in order, including those of arrays a refill or a
    drain replaced."""
    head = ReserveHead(np.copy, lambda a, b: np.concatenate((a, b)), 8)
    assert head.unmarked() is None
    head.extend([1, 2, 3, 4])
    assert head.take(3).tolist() == [1, 2, 3]
    head.extend([5, 6])  # the head's array replaced: 4, 5, 6
    assert head.take(2).tolist() == [4, 5]
    assert head.unmarked().tolist() == [1, 2, 3, 4, 5]
    assert head.unmarked() is None
    assert head.take(1).tolist() == [6]
    head.extend([7, 8])
    assert head.take(1).tolist() == [7]
    assert head.drain().tolist() == [8]
    assert head.unmarked().tolist() == [6, 7]
    assert head.unmarked() is None and len(head) == 0


def test_the_token_allocators_frees_find_the_heads_pages_taken(make_daemon):
    """Slots handed out by several allocs, across a refill of the head,
    are the allocator's to free without a round trip (its record of them
    is written when a free reads it); a slot the head still holds is not."""
    with lone(make_daemon, 1, 64, mirror_pages=8) as allocator:
        first = host(allocator.alloc(6))
        second = host(allocator.alloc(5))  # 2 from the head, then a refill
        assert allocator.mirror_stats["misses"] == 2
        reserve = allocator.reserve
        takes = reserve.stats()["takes"]
        allocator.free(second)
        allocator.free(first)
        # Held back behind the free list, as SGLang's token allocator
        # holds them: the reserve is still open, nothing went to the
        # daemon.
        assert allocator.reserve is reserve
        assert reserve.stats()["takes"] == takes
        assert allocator.available_size() == 64
        with pytest.raises(pagealloc.PageallocError):
            allocator.free_page_ids(first[:1])  # freed already


# ---------------------------------------------------------------- sharing


def test_a_starving_session_gets_the_other_sessions_reserve(make_daemon):
    daemon = start(make_daemon, 4, 64)
    with daemon.connect(name="a") as ca, daemon.connect(name="b") as cb:
        # A's first alloc waits for its own thread's refill in flight as
        # long as it takes (the test's bound is for a hung test).
        a = sglang.make_allocator(ca, reserve_options=dict(
            max_pages=48, initial_batch=16, starved_wait=60))
        # B waits as long as it takes the other session to answer: the
        # bound is for a hung test, not a timing the test relies on.
        a.free(a.alloc(48 * 4))  # A's reserve holds 48 pages now
        # A refill the reserve's thread had in flight comes back above the
        # high mark and is returned: wait for the reserve to settle.
        wait_until(lambda: a.reserve.stats()["pages"] == 48 and ca.stats(
        ).free_pages == 16, what="A's reserve to hold its 48 pages")
        b = sglang.make_allocator(cb, reserve_options=dict(starved_wait=60))
        out = host(b.alloc(32 * 4))
        assert out is not None
        assert len(np.unique(out // 4)) == 32
        # A answered the daemon's ask (its counts follow the return's
        # round trip).
        wait_until(lambda: a.reserve.stats()["reclaims"] >= 1,
                   what="A's reserve to count the ask it answered")
        assert a.reserve.stats()["pages_returned"] >= 16
        # No page is both B's and in A's reserve: the daemon's books.
        stats = cb.stats()
        assert stats.free_pages + stats.used_pages == 64
        b.free(out)
        a.close()
        b.close()


def test_the_token_allocators_frees_are_its_reserves_at_once(make_daemon):
    """The token allocator's freed slots queue behind its free list under
    the reserve's pages (put_under), not held back in this process: its
    reserve counts them at once, and its thread gives them to a starving
    session."""
    if not pagealloc._native.HAS_RESERVE_PUT_UNDER:
        pytest.skip("a library before ABI 1.10 holds the frees back")
    daemon = start(make_daemon, 1, 64)
    with daemon.connect(name="a") as ca, daemon.connect(name="b") as cb:
        # No head: A's pages are its reserve's or handed out.
        a = sglang.make_allocator(ca, mirror_pages=0, reserve_options=dict(
            max_pages=64, initial_batch=8, starved_wait=60))
        out = host(a.alloc(48))
        assert out is not None
        a.free(out)
        assert a.reserve.stats()["handed_out"] == 0
        # A's reserve and the free pool hold every page; B needs more than
        # the pool can hold without A's freed ones. B waits as long as it
        # takes A to answer: the bound is for a hung test.
        b = sglang.make_allocator(cb, reserve_options=dict(starved_wait=60))
        got = host(b.alloc(40))
        assert got is not None and len(np.unique(got)) == 40
        wait_until(lambda: a.reserve.stats()["reclaims"] >= 1,
                   what="A's reserve to count the ask it answered")
        stats = cb.stats()
        assert stats.free_pages + stats.used_pages == 64
        b.free(got)
        a.close()
        b.close()


CHILD = r"""
import sys
from pagealloc import sglang
allocator = sglang.make_allocator(sys.argv[1], reserve_options=dict(
    max_pages=32, initial_batch=32))
held = allocator.alloc(4 * 8)
print(allocator.reserve.stats()["pages"], len(held), flush=True)
sys.stdin.read()
"""


def test_a_killed_process_gives_back_its_whole_reserve(make_daemon):
    daemon = start(make_daemon, 4, 32)
    child = subprocess.Popen([sys.executable, "-c", CHILD, daemon.target],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=os.environ.copy())
    try:
        reserve_pages, held = child.stdout.readline().split()
        assert int(reserve_pages) + int(held) // 4 == 32
        with daemon.connect() as client:
            assert client.stats().free_pages == 0
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=20)
            wait_until(lambda: client.stats().free_pages == 32,
                       what="the dead session's pages to come back")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# ---------------------------------------------------------- hostile frees


def test_a_published_page_is_freed_to_the_daemon_never_to_the_reserve(
        make_daemon):
    """A page the reserve handed out and the allocator then published is
    shared: freeing it, alone or among pages the reserve handed out, drops
    the session's reference in the daemon (the page stays cached there,
    held by no session) and never puts it back into the reserve for
    another request."""
    for mixed in (False, True):
        with lone(make_daemon, 4, 8) as allocator:
            client = allocator.client
            first = host(allocator.alloc(4))
            rest = host(allocator.alloc(8))
            (page,) = pages_of(first, 4)
            client.publish([page], [b"p" * 32])
            allocator.pages_published([page])
            assert client.stats().prefix_published_pages == 1
            allocator.free(np.concatenate((first, rest)) if mixed else first)
            stats = client.stats()
            assert stats.prefix_published_pages == 0
            assert stats.prefix_cached_pages == 1
            if not mixed:
                allocator.free(rest)
            # Seven pages free, the cached one evictable.
            assert allocator.available_size() == 8 * 4


def test_frees_of_slots_never_given_out_change_nothing(make_daemon):
    daemon = start(make_daemon, 4, 16)
    with daemon.connect(name="a") as ca, daemon.connect(name="b") as cb:
        allocator = sglang.make_allocator(ca, reserve_options=whole_pool(16))
        other = sglang.make_allocator(cb, use_reserve=False)
        mine = host(allocator.alloc(8))  # pages 1, 2
        assert mine.tolist() == list(range(4, 12))
        allocator.free(allocator.alloc(4))  # page 3 back in the reserve

        def unchanged():
            assert allocator.available_size() == 14 * 4
            assert ca.stats().used_pages == 16

        bad = [
            # A partial page of the reserve's (SGLang's complete blocks).
            (mine[:3], pagealloc.InvalidArgumentError, "complete page"),
            (mine[1:5], pagealloc.InvalidArgumentError, "whole page"),
            (np.array([4, 5, 6, 7, 4, 5, 6, 7]),
             pagealloc.InvalidArgumentError, "twice"),
            # With a slot outside the pool.
            (np.concatenate((mine[:4], [68, 69, 70, 71])),
             pagealloc.InvalidArgumentError, "outside the pool"),
        ]
        for slots, error, words in bad:
            with pytest.raises(error, match=words):
                allocator.free(slots)
            unchanged()
            allocator.free_group_begin()
            with pytest.raises(error, match=words):
                allocator.free(slots)
            allocator.free_group_end()
            unchanged()
        with pytest.raises(pagealloc.InvalidArgumentError, match="twice"):
            allocator.free_page_ids([1, 1])
        unchanged()
        with pytest.raises(pagealloc.InvalidArgumentError, match="twice"):
            allocator.free(np.tile(mine[:4], 20))  # more pages than the pool
        unchanged()
        # Pages the reserve holds, or never gave: the daemon refuses them
        # (the reserve's pages go back to the pool first, so it can).
        for pages in ([3], [2, 16], [17], [0]):
            with pytest.raises(pagealloc.PageallocError):
                allocator.free_page_ids(pages)
            assert allocator.available_size() == 14 * 4
        # Another session's page.
        theirs = host(other.alloc(4))
        with pytest.raises(pagealloc.PageallocError):
            allocator.free(theirs)
        assert cb.stats().used_pages >= 1
        other.free(theirs)
        # What the allocator did give out is still freed.
        allocator.free(mine)


def test_the_token_allocators_frees_of_slots_never_given_out_change_nothing(
        make_daemon):
    """At page size 1 a free is one put_under, which the library checks:
    a slot named twice, one outside the pool, one the reserve holds,
    another session's: refused with its own error and nothing freed (the
    slots given out are freed after, each once, and the other session's
    page stays its own)."""
    daemon = start(make_daemon, 1, 64)
    with daemon.connect(name="a") as ca, daemon.connect(name="b") as cb:
        other = sglang.make_allocator(cb, use_reserve=False)
        theirs = host(other.alloc(1))  # 1
        allocator = sglang.make_allocator(ca, reserve_options=whole_pool(64))
        mine = host(allocator.alloc(8))
        assert mine.tolist() == list(range(2, 10))
        held = host(allocator.alloc(1))  # 10: freed, so the reserve holds it
        allocator.free(held)
        for slots, error, words in (
                ([2, 2], pagealloc.InvalidArgumentError, "names page 2 twice"),
                ([3, 4, 3], pagealloc.InvalidArgumentError, "page 3 twice"),
                ([4, 65], pagealloc.InvalidArgumentError, "outside"),
                ([0], pagealloc.InvalidArgumentError, "outside"),
                # Not the reserve's to take back, so the daemon is asked
                # (the reserve's pages go back to the pool first, so it
                # can refuse them).
                (held, pagealloc.FailedPreconditionError, "double free"),
                ([5, 10], pagealloc.FailedPreconditionError, "double free"),
                (theirs, pagealloc.PageallocError, "")):
            with pytest.raises(error, match=words):
                allocator.free(np.asarray(slots, dtype=np.int64))
        allocator.free(mine)  # each once: none was freed above
        with pytest.raises(pagealloc.FailedPreconditionError):
            allocator.free(mine[:1])
        again = host(allocator.alloc(63))
        assert sorted(again.tolist()) == list(range(2, 65))
        other.free(theirs)  # still the other session's
        allocator.close()


def test_alloc_bench_reports_every_row(make_daemon, tmp_path):
    """python/bench/sglang_alloc_bench.py in a tiny configuration: every
    row is there and the reserve's steps make at most half the thin path's
    round trips once warm (no time is checked)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "bench"))
    import sglang_alloc_bench
    targets = [start(make_daemon, 1, 1024).target,
               start(make_daemon, 16, 64).target]
    args = []
    for target in targets:
        args += ["--target", target]
    rows = sglang_alloc_bench.main(args + [
        "--iterations", "20", "--warmup", "5", "--decode_requests", "8",
        "--json",
        str(tmp_path / "rows.json")])
    assert sorted((row["page_size"], row["path"]) for row in rows) == [
        (ps, path) for ps in (1, 16) for path in ("mirror", "reserve",
                                                  "thin")]
    for row in rows:
        assert row["alloc_p50_us"] > 0 and row["free_p50_us"] > 0
        assert ("decode_p50_us" in row) == (row["page_size"] > 1)
        if row["page_size"] > 1:
            assert row["decode_p50_us"] > 0
            assert row["decode_new_page_p50_us"] > 0
        if row["path"] != "thin":
            # The thin path makes one round trip a step. The reserve's make
            # none once warm, unless its thread's refill is late for a step:
            # on a loaded 2-core host under ASan, 2 of 20 steps were.
            assert row["round_trips_per_step"] <= 0.5
            assert row["daemon_pages_per_step"] >= 0
        # The mirror, on its path. At page size 16 each step frees what it
        # took, so the next take is the mirror's next pages unless the
        # reserve's thread refilled on top meanwhile.
        # The token allocator's head (page size 1) fills up from what its
        # reserve's thread has refilled, which 25 steps may not see:
        # test_the_token_allocators_head_is_sliced_without_a_take.
        has_mirror = row["path"] == "mirror" and (
            pagealloc._native.HAS_RESERVE_PEEK or row["page_size"] == 1)
        assert ("mirror_hit_rate" in row) == has_mirror
        if has_mirror and row["page_size"] > 1:
            assert row["mirror_hit_rate"] > 0


def test_alloc_bench_passes_take_medians_and_ratios_per_pass(make_daemon,
                                                             tmp_path):
    """--passes runs the chosen paths in turn and reports each figure's
    median over the passes; the ratios to SGLang's calls are taken pass by
    pass (checked on made-up rows: SGLang's calls need CUDA)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "bench"))
    import sglang_alloc_bench
    target = start(make_daemon, 16, 64).target
    rows = sglang_alloc_bench.main([
        "--target", target, "--iterations", "10", "--warmup", "2",
        "--decode_requests", "4", "--paths", "mirror", "--passes", "2"])
    assert [(row["page_size"], row["path"]) for row in rows] == [
        (16, "mirror")]
    assert rows[0]["alloc_p50_us"] > 0 and "pass" not in rows[0]

    def row(path, alloc, decode):
        return {"page_size": 16, "path": path, "gpu_work": False,
                "alloc_p50_us": alloc, "decode_p50_us": decode}
    passes = [[row("sglang", 10.0, 100.0), row("mirror", 5.0, 40.0)],
              [row("sglang", 20.0, 50.0), row("mirror", 30.0, 30.0)],
              [row("sglang", 10.0, 80.0), row("mirror", 12.0, 60.0)]]
    medians = sglang_alloc_bench.median_rows(passes)
    assert [(r["path"], r["alloc_p50_us"], r["decode_p50_us"])
            for r in medians] == [("sglang", 10.0, 80.0),
                                  ("mirror", 12.0, 40.0)]
    ratios = {r["call"]: r for r in sglang_alloc_bench.sglang_ratios(passes)}
    assert set(ratios) == {"alloc", "decode"}
    assert ratios["alloc"]["median"] == pytest.approx(1.2)
    assert ratios["alloc"]["min"] == pytest.approx(0.5)
    assert ratios["alloc"]["max"] == pytest.approx(1.5)
    assert ratios["decode"]["median"] == pytest.approx(0.6)
    assert ratios["decode"]["passes"] == 3


def test_the_token_allocators_tensor_frees_keep_sglangs_order(make_daemon):
    """The token allocator's frees of tensors go through its queue of
    frees (_unread_frees.py; a CPU tensor's lands at once, a CUDA tensor's
    later, test_sglang_gpu.py): the freed slots come back at the free
    list's end in the order freed, a free group's tensors and arrays
    included, int32 too; a free naming a slot twice raises its own error
    and frees nothing (one session, its reserve the whole pool)."""
    torch = pytest.importorskip("torch")
    daemon = start(make_daemon, 1, 256)
    with daemon.connect() as client:
        allocator = sglang.make_allocator(
            client, device="cpu", reserve_options=whole_pool(256))
        first = torch.as_tensor(host(allocator.alloc(8)))
        assert first.tolist() == list(range(1, 9))
        allocator.free(first[[4, 5, 6, 7]])
        allocator.free_group_begin()
        allocator.free(first[[0]])
        allocator.free(first[[2]].numpy())  # an array between two tensors
        allocator.free(first[[1]].to(torch.int32))
        allocator.free_group_end()
        assert allocator.available_size() == 248 + 7
        rest = torch.as_tensor(host(allocator.alloc(255)))
        np.testing.assert_array_equal(
            rest.numpy(), np.concatenate((np.arange(9, 257),
                                          [5, 6, 7, 8, 1, 3, 2])))
        allocator.free(rest[:-7])
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match="^INVALID_ARGUMENT: free_index names page 5 twice"):
            allocator.free(torch.tensor([5, 5]))
        assert allocator.available_size() == 256 - 8  # 4 and the 7
        allocator.free(torch.tensor([5], dtype=torch.int32))
        assert allocator.available_size() == 256 - 7
        allocator.close()
