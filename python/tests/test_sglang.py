"""pagealloc.sglang's thin path (use_reserve=False: every call to the
daemon) against the NumPy statement of SGLang's allocators.

Each configuration (page size 1, 4, 16, 64; lifo and sorted) starts one
daemon with --semantics=sglang and runs one long random trace through the
drop-in class and through pagealloc.sglang_model side by side, comparing
every result slot for slot (or None for None) and, after every operation,
the daemon's free list with the model's, element for element, and its
parked pages with the model's as sets (docs/design.md section 10: the
daemon keeps parked pages in the order freed). Then the golden vector,
the places where a shared pool differs on purpose, and the lazy release
of result views.
"""

import copy
import os
import sys

import numpy as np
import pytest

import pagealloc
from pagealloc import sglang
from pagealloc.sglang_model import make_allocator_model

from conftest import BACKEND

pytestmark = pytest.mark.skipif(
    BACKEND != "cpu", reason="the CPU backend's traces (GPU: "
    "test_sglang_gpu.py)")

# Operations per trace: 8 traces stay well under a minute on 2 cores.
TRACE_OPS = int(os.environ.get("PAGEALLOC_SGLANG_TRACE_OPS", "700"))

try:
    import torch as _torch
except ImportError:  # pragma: no cover - depends on the host
    _torch = None


@pytest.fixture(autouse=True,
                params=["numpy"] + (["torch"] if _torch is not None else []))
def results_as(request, monkeypatch):
    """Every test runs twice where PyTorch is importable: once with the
    adapter's tensor path (results are torch tensors, as SGLang's
    schedulers get them) and once as if PyTorch were missing (NumPy
    arrays)."""
    if request.param == "numpy":
        monkeypatch.setattr(sglang, "torch", None)
    return request.param


def host(values):
    """A result (tensor, array or None) as a NumPy array or None."""
    if values is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy().astype(np.int64)
    return np.array(values, dtype=np.int64)


def start(make_daemon, page_size, num_pages, policy):
    return make_daemon("--semantics=sglang", "--page_size=%d" % page_size,
                       "--num_pages=%d" % num_pages,
                       "--free_policy=%s" % policy)


class Trace:
    """A random scheduler: requests with KV rows, driven through the
    daemon-backed allocator and the model on the same calls."""

    def __init__(self, allocator, model, page_size, rng):
        self.a = allocator
        self.m = model
        self.ps = page_size
        self.rng = rng
        self.rows = {}  # request id -> its slots (the KV row), a list
        self.next_id = 0
        self.state = None  # (allocator state, model state, rows) or None
        self.counts = {}

    # ---------------------------------------------------------- checking

    def check_lists(self, what):
        free, parked = self.a.client.free_lists(max_pages=self.m.num_pages)
        np.testing.assert_array_equal(
            np.asarray(free), self.m.free_pages,
            err_msg="free list after %s" % what)
        assert sorted(np.asarray(parked).tolist()) == sorted(
            self.m.release_pages.tolist()), "parked pages after %s" % what
        assert self.a.available_size() == self.m.available_size(), what

    def same(self, got, want, what):
        got = host(got)
        if want is None:
            assert got is None, "%s: model None, daemon %s" % (what, got)
            return None
        assert got is not None, "%s: daemon None, model %s" % (what, want)
        np.testing.assert_array_equal(got, want, err_msg=what)
        return got.tolist()

    def count(self, name):
        self.counts[name] = self.counts.get(name, 0) + 1

    # -------------------------------------------------------- operations

    def pick(self, k):
        ids = list(self.rows)
        self.rng.shuffle(ids)
        return ids[:k]

    def new_id(self):
        self.next_id += 1
        return self.next_id

    def op_extend(self):
        ps = self.ps
        batch = []
        for rid in self.pick(int(self.rng.integers(0, 4))):
            batch.append(rid)
        for _ in range(int(self.rng.integers(0 if batch else 1, 4))):
            rid = self.new_id()
            self.rows[rid] = []
            batch.append(rid)
        prefix = np.array([len(self.rows[r]) for r in batch], np.int64)
        # Empty extends, partial pages and several pages.
        ext = self.rng.integers(0, 3 * ps + 2, size=len(batch))
        ext[self.rng.random(len(batch)) < 0.15] = 0
        seq = prefix + ext
        last = np.array([self.rows[r][-1] if self.rows[r] else -1
                         for r in batch], np.int64)
        n = int(ext.sum())
        got = self.a.alloc_extend(prefix, prefix.copy(), seq, seq.copy(),
                                  last, n)
        want = self.m.alloc_extend(prefix, seq, last, n)
        out = self.same(got, want, "alloc_extend(%s, %s, %s)" %
                        (prefix.tolist(), seq.tolist(), last.tolist()))
        if out is None:
            self.count("extend None")
            for r in batch:  # new requests that got nothing
                if not self.rows[r]:
                    del self.rows[r]
            return
        self.count("extend")
        at = 0
        for r, e in zip(batch, ext):
            self.rows[r].extend(out[at:at + int(e)])
            at += int(e)
        for r in batch:
            if not self.rows[r]:
                del self.rows[r]

    def op_decode(self):
        batch = self.pick(int(self.rng.integers(1, 9)))
        if not batch:
            return self.op_extend()
        seq = np.array([len(self.rows[r]) + 1 for r in batch], np.int64)
        last = np.array([self.rows[r][-1] for r in batch], np.int64)
        got = self.a.alloc_decode(seq, seq.copy(), last)
        want = self.m.alloc_decode(seq, last)
        out = self.same(got, want, "alloc_decode(%s, %s)" %
                        (seq.tolist(), last.tolist()))
        if out is None:
            self.count("decode None")
            return
        self.count("decode")
        for r, s in zip(batch, out):
            self.rows[r].append(s)

    def op_alloc(self):
        ps = self.ps
        need = int(self.rng.integers(0, 5 if ps > 1 else 24)) * ps
        if self.rng.random() < 0.2:
            need += int(self.rng.integers(0, ps))  # SGLang truncates
        got = self.a.alloc(need)
        want = self.m.alloc(need)
        out = self.same(got, want, "alloc(%d)" % need)
        if out is None:
            self.count("alloc None")
        elif out:
            self.count("alloc")
            self.rows[self.new_id()] = out

    def op_free(self):
        for rid in self.pick(int(self.rng.integers(1, 4))):
            row = np.array(self.rows.pop(rid), np.int64)
            self.a.free(row)
            self.m.free(row)
            self.count("free")

    def op_free_segment(self):
        """Frees a page-aligned tail of a request (free_segment), keeping
        its head: a radix cache dropping what it holds elsewhere."""
        ps = self.ps
        for rid in self.pick(1):
            row = self.rows[rid]
            start = int(self.rng.integers(0, len(row) // ps + 1)) * ps
            segment = np.array(row[start:], np.int64)
            if segment.size == 0:
                continue
            self.a.free_segment(segment, start_pos=start)
            self.m.free_segment(segment, start)
            self.count("free_segment")
            if start == 0:
                del self.rows[rid]
            else:
                self.rows[rid] = row[:start]

    def op_free_group(self):
        self.a.free_group_begin()
        self.m.free_group_begin()
        for _ in range(int(self.rng.integers(0, 4))):
            if self.ps > 1 and self.rng.random() < 0.3:
                self.op_free_segment()
            else:
                self.op_free()
        self.a.free_group_end()
        self.m.free_group_end()
        self.count("free group")

    def op_backup(self):
        self.state = (self.a.backup_state(), self.m.backup_state(),
                      copy.deepcopy(self.rows), len(self.m.release_pages))
        self.count("backup")

    def op_restore(self):
        """Restores the saved state when nothing since could make the
        daemon differ: no free, no merge (docs/python.md)."""
        a_state, m_state, rows, parked = self.state
        if len(self.m.release_pages) != parked:
            self.state = None  # a merge since: restore is not SGLang's
            return
        self.a.restore_state(a_state)
        self.m.restore_state(m_state)
        self.rows = copy.deepcopy(rows)
        self.count("restore")

    def op_merge(self):
        self.a.merge_and_sort_free()
        self.m.merge_and_sort_free()
        self.count("merge")

    def op_clear(self):
        self.a.clear()
        self.m.clear()
        self.rows = {}
        self.state = None
        self.count("clear")

    def run(self, num_ops):
        if self.ps == 1:
            ops = [(self.op_alloc, 8), (self.op_free, 5),
                   (self.op_free_group, 2)]
        else:
            ops = [(self.op_extend, 6), (self.op_decode, 6),
                   (self.op_alloc, 1), (self.op_free, 4),
                   (self.op_free_segment, 1), (self.op_free_group, 2)]
        ops += [(self.op_merge, 0.3), (self.op_clear, 0.05)]
        weights = np.array([w for _, w in ops], float)
        weights /= weights.sum()
        for step in range(num_ops):
            if self.state is None and self.rng.random() < 0.03:
                self.op_backup()
                self.check_lists("backup_state at step %d" % step)
                continue
            if self.state is not None:
                # Between a backup and its restore only allocations, as
                # SGLang's speculative steps do; then restore (maybe twice).
                r = self.rng.random()
                if r < 0.25:
                    self.op_restore()
                    if self.rng.random() < 0.6:
                        self.state = None
                elif r < 0.3:
                    self.state = None  # given up without a restore
                else:
                    (self.op_decode if self.ps > 1 and self.rng.random() < 0.5
                     else (self.op_extend if self.ps > 1 else self.op_alloc))()
                self.check_lists("step %d (after a backup)" % step)
                continue
            op = ops[int(self.rng.choice(len(ops), p=weights))][0]
            if (op in (self.op_free, self.op_free_segment,
                       self.op_free_group) and
                    self.m.available_size() > self.m.num_pages * self.ps // 3):
                # Keep the pool at least a third full, where shortages and
                # merges happen.
                op = self.op_alloc if self.ps == 1 else self.op_extend
            op()
            self.check_lists("%s at step %d" % (op.__name__, step))


CONFIGS = [(ps, policy) for ps in (1, 4, 16, 64)
           for policy in ("lifo", "sorted")]


@pytest.mark.parametrize("page_size,policy", CONFIGS,
                         ids=["ps%d-%s" % c for c in CONFIGS])
def test_trace_matches_the_model(make_daemon, page_size, policy):
    # Small pools, so that shortages and merges are frequent.
    num_pages = {1: 96, 4: 48, 16: 40, 64: 24}[page_size]
    daemon = start(make_daemon, page_size, num_pages, policy)
    need_sort = policy == "sorted"
    with daemon.connect(name="trace") as client:
        allocator = sglang.make_allocator(client, use_reserve=False)
        assert type(allocator) is (sglang.TokenToKVPoolAllocator
                                   if page_size == 1 else
                                   sglang.PagedTokenToKVPoolAllocator)
        assert allocator.need_sort == need_sort
        model = make_allocator_model(num_pages * page_size, page_size,
                                     need_sort)
        trace = Trace(allocator, model, page_size,
                      np.random.default_rng(1000 * page_size + need_sort))
        trace.check_lists("start")
        trace.run(TRACE_OPS)
        print("ps %d %s: %s" % (page_size, policy, trace.counts))
        # The trace exercised what it is about.
        if page_size == 1:
            assert trace.counts.get("alloc None", 0) > 0
        else:
            for name in ("extend", "extend None", "decode", "free_segment"):
                assert trace.counts.get(name, 0) > 0, (name, trace.counts)
        for name in ("free", "free group", "restore", "merge"):
            assert trace.counts.get(name, 0) > 0, (name, trace.counts)


def test_golden_vector(make_daemon):
    """Page size 4, prefix 2 -> seq 11, free pages [3, 4, ...]: the rest of
    the prefix's page, one whole page, three slots of the next. SGLang's
    vector puts the prefix in page 0 (last_loc 1 -> [2, 3, 12..18]); the
    daemon refuses page 0, so here the prefix is in page 2 (slots 8, 9)."""
    model = make_allocator_model(16 * 4, 4)
    model.free_pages = np.arange(3, 17, dtype=np.int64)
    np.testing.assert_array_equal(
        model.alloc_extend([2], [11], [1], 9),
        [2, 3, 12, 13, 14, 15, 16, 17, 18])

    daemon = start(make_daemon, 4, 16, "lifo")
    with daemon.connect() as client:
        allocator = sglang.PagedTokenToKVPoolAllocator(
            64, 4, None, "cpu", None, False, client=client,
            use_reserve=False)
        np.testing.assert_array_equal(host(allocator.alloc(4)), [4, 5, 6, 7])
        np.testing.assert_array_equal(
            host(allocator.alloc_extend([0], [0], [2], [2], [-1], 2)), [8, 9])
        np.testing.assert_array_equal(host(allocator.free_pages)[:2], [3, 4])
        out = allocator.alloc_extend([2], [2], [11], [11], [9], 9)
        np.testing.assert_array_equal(
            host(out), [10, 11, 12, 13, 14, 15, 16, 17, 18])
        # The same shortage answer as SGLang: None, nothing taken.
        before = host(allocator.free_pages)
        assert allocator.alloc_extend([0], [0], [100], [100], [-1],
                                      100) is None
        np.testing.assert_array_equal(host(allocator.free_pages), before)


def test_free_orders(make_daemon):
    """free() puts pages back ascending (torch.unique), free_segment in the
    segment's order, the token allocator's free in the order given."""
    daemon = start(make_daemon, 4, 16, "lifo")
    with daemon.connect() as client:
        allocator = sglang.make_allocator(client, use_reserve=False)
        a = host(allocator.alloc(8))        # pages 1, 2
        b = host(allocator.alloc(8))        # pages 3, 4
        allocator.free(np.concatenate((b, a)))
        np.testing.assert_array_equal(host(allocator.free_pages)[:4],
                                      [1, 2, 3, 4])
        a = host(allocator.alloc(16))       # pages 1..4
        allocator.free_segment(a[8:][::-1].copy(), start_pos=0)
        np.testing.assert_array_equal(host(allocator.free_pages)[:2], [4, 3])

    daemon = start(make_daemon, 1, 8, "lifo")
    with daemon.connect() as client:
        allocator = sglang.make_allocator(client, use_reserve=False)
        slots = host(allocator.alloc(3))
        np.testing.assert_array_equal(slots, [1, 2, 3])
        allocator.free(slots[::-1].copy())  # appended: FIFO reuse
        np.testing.assert_array_equal(host(allocator.free_pages),
                                      [4, 5, 6, 7, 8, 3, 2, 1])


def test_merge_and_sort_free_takes_no_page(make_daemon):
    daemon = start(make_daemon, 4, 8, "sorted")
    with daemon.connect() as client:
        allocator = sglang.make_allocator(client, use_reserve=False)
        slots = host(allocator.alloc(16))   # pages 1..4
        allocator.free(slots[8:])           # parks 3, 4
        allocator.free(slots[:4])           # parks 1
        free, parked = client.free_lists()
        assert sorted(parked.tolist()) == [1, 3, 4]
        assert allocator.available_size() == 7 * 4
        allocator.merge_and_sort_free()
        free, parked = client.free_lists()
        assert parked.size == 0
        np.testing.assert_array_equal(free, [1, 3, 4, 5, 6, 7, 8])
        assert client.stats().used_pages == 1
        allocator.merge_and_sort_free()     # nothing parked: no change
        np.testing.assert_array_equal(client.free_lists()[0], free)


def test_states_are_values(make_daemon):
    daemon = start(make_daemon, 4, 16, "lifo")
    with daemon.connect() as client:
        allocator = sglang.make_allocator(client, use_reserve=False)
        first = allocator.backup_state()
        a = host(allocator.alloc(8))
        second = allocator.backup_state()
        allocator.alloc(4)
        allocator.restore_state(second)     # nested: the inner one
        np.testing.assert_array_equal(host(allocator.free_pages)[:1], [3])
        allocator.alloc(4)
        allocator.restore_state(second)     # the same state twice
        np.testing.assert_array_equal(host(allocator.free_pages)[:1], [3])
        allocator.restore_state(first)
        np.testing.assert_array_equal(host(allocator.free_pages),
                                      np.arange(1, 17))
        # The inner state ended with the restore to the outer one: SGLang
        # would set its lists back; the daemon refuses.
        with pytest.raises(pagealloc.FailedPreconditionError):
            allocator.restore_state(second)
        # A free after the backup stays done: restore returns only pages
        # still held (the pool may have given the freed ones away).
        state = allocator.backup_state()
        a = host(allocator.alloc(8))        # pages 1, 2
        allocator.free(a[:4])               # page 1 back at the front
        allocator.alloc(4)                  # page 1 again
        allocator.restore_state(state)
        free = host(allocator.free_pages)
        assert sorted(free[:2].tolist()) == [1, 2] and free[2] == 3
        with pytest.raises(TypeError):
            allocator.restore_state((None, None))


def test_shared_pool_clear_and_views(make_daemon):
    """With another session on the pool: clear frees only this session's
    pages and does not reset the list; available_size and free_pages see
    the other session's pages."""
    daemon = start(make_daemon, 4, 8, "lifo")
    with daemon.connect(name="a") as ca, daemon.connect(name="b") as cb:
        a = sglang.make_allocator(ca, use_reserve=False)
        b = sglang.make_allocator(cb, use_reserve=False)
        a.alloc(8)                              # pages 1, 2
        b.alloc(4)                              # page 3
        assert a.available_size() == 5 * 4
        a.clear()
        np.testing.assert_array_equal(host(a.free_pages),
                                      [1, 2, 4, 5, 6, 7, 8])
        # b's page is b's: freeing it from a is refused, nothing changes.
        with pytest.raises(pagealloc.PermissionDeniedError):
            a.free([12])
        b.clear()                               # nobody holds a page now
        np.testing.assert_array_equal(host(a.free_pages), np.arange(1, 9))


def test_constructor_refuses_a_pool_it_cannot_serve(make_daemon):
    plain = make_daemon("--page_size=4", "--num_pages=8")
    with plain.connect() as client:
        with pytest.raises(ValueError, match="--semantics=sglang"):
            sglang.make_allocator(client)
    daemon = start(make_daemon, 4, 8, "lifo")
    with daemon.connect() as client:
        with pytest.raises(ValueError, match="--free_policy=sorted"):
            sglang.make_allocator(client, need_sort=True)
        with pytest.raises(ValueError, match="pool's 32 slots"):
            sglang.PagedTokenToKVPoolAllocator(64, 4, None, "cpu", None,
                                               False, client=client)
        with pytest.raises(ValueError, match="page_size 8"):
            sglang.PagedTokenToKVPoolAllocator(None, 8, client=client)
        with pytest.raises(NotImplementedError):
            sglang.TokenToKVPoolAllocator.alloc_extend(None)
    # A target instead of a client: the allocator connects itself.
    allocator = sglang.make_allocator(daemon.target)
    assert allocator.client.pool.page_size == 4
    allocator.close()


def test_results_stay_for_keep_allocations_calls(make_daemon):
    """A result aliases the ring until keep_allocations later calls; with
    keep_allocations=0 each result is a copy."""
    daemon = start(make_daemon, 4, 64, "lifo")
    with daemon.connect(ring_capacity_slots=64) as client:
        allocator = sglang.make_allocator(client, use_reserve=False,
                                          keep_allocations=2)
        first = allocator.alloc(16)
        kept = host(first).copy()
        allocator.alloc(16)
        allocator.alloc(16)
        np.testing.assert_array_equal(host(first), kept)   # 2 calls later
        for _ in range(3):  # the ring (64 slots) wraps onto `first`
            allocator.alloc(16)
        client.flush_release()
        assert not np.array_equal(host(first), kept)
    with daemon.connect(ring_capacity_slots=64) as client:
        allocator = sglang.make_allocator(client, use_reserve=False,
                                          keep_allocations=0)
        first = allocator.alloc(16)
        kept = host(first).copy()
        for _ in range(8):
            allocator.alloc(16)
            allocator.free(host(allocator.alloc(16)))
        np.testing.assert_array_equal(host(first), kept)


def test_inputs_of_every_form_give_the_same_slots(make_daemon):
    """The host inputs are read in place when they are contiguous int64
    arrays and converted otherwise (lists, int32, strided, 2-D): the same
    call gives the same slots either way; a float array is refused."""
    daemon = start(make_daemon, 4, 16, "lifo")
    with daemon.connect() as client:
        allocator = sglang.make_allocator(client, use_reserve=False)
        first = host(allocator.alloc_extend([0, 0], [0, 0], [1, 1], [1, 1],
                                            [-1, -1], 2))
        seq = np.array([2, 2], np.int64)
        want = first + 1  # the next slot of each request's page
        forms = [
            (seq, first.copy()),
            (seq.tolist(), first.tolist()),
            (seq.astype(np.int32), first.astype(np.int32)),
            (np.repeat(seq, 2)[::2], np.repeat(first, 2)[::2]),
            (seq.reshape(1, 2), first.reshape(2, 1)),
        ]
        for seq_in, last_in in forms:
            np.testing.assert_array_equal(
                host(allocator.alloc_decode(seq_in, seq_in, last_in)), want)
            np.testing.assert_array_equal(
                host(allocator.alloc_decode(None, seq_in, last_in)), want)
        with pytest.raises(TypeError, match="last_loc"):
            allocator.alloc_decode(seq, seq, first.astype(np.float64))
        with pytest.raises(ValueError, match="extend_num_tokens"):
            allocator.alloc_extend([1], [1], [3], [3], [first[0]], 3)
        assert host(allocator.alloc_decode([], [], [])).size == 0
        # alloc(n) reuses one input buffer: sizes change call to call.
        assert host(allocator.alloc(8)).size == 8
        assert host(allocator.alloc(4)).size == 4


def test_none_whatever_limit_a_call_hits_first(make_daemon):
    # docs/python.md's profile: the pool is 2^20 slots, and the default
    # ring holds the whole pool. A call longer than the pool is None,
    # whether the ring or the pool refuses it first.
    daemon = start(make_daemon, 16, 65536, "lifo")
    size = 65536 * 16
    with daemon.connect() as client:
        assert client.ring.capacity_slots >= size
        allocator = sglang.make_allocator(client, use_reserve=False)
        assert allocator.alloc(size + 16) is None
        assert allocator.alloc(2 * size) is None
        none = allocator.alloc_extend([0], [0], [size + 16], [size + 16],
                                      [-1], size + 16)
        assert none is None
        assert client.stats().used_pages == 0
        whole = host(allocator.alloc(size))  # the whole pool still serves
        assert whole.size == size
        allocator.free(whole)
    # A ring smaller than the pool: a call of more slots than it holds is
    # None as well (no release can make it fit), and smaller calls serve.
    with daemon.connect(ring_capacity_slots=1024) as client:
        allocator = sglang.make_allocator(client, use_reserve=False)
        assert allocator.alloc(2048) is None
        assert allocator.alloc_extend([0, 0], [0, 0], [1024, 16], [1024, 16],
                                      [-1, -1], 1040) is None
        assert host(allocator.alloc(1024)).size == 1024
