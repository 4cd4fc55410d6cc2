"""pagealloc.sglang_radix.RadixCache against a real daemon: long random
request traces driven through it and through the statement of SGLang's
RadixCache (pagealloc/sglang_radix_model.py) step for step, one scheduler
hitting another's pages with the KV bytes it wrote, also after the writer
reset, evicted or was killed, and misuse (locks released too often, locked
nodes under eviction, nodes of another tree)."""

import dataclasses
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest

import pagealloc
import pagealloc.sglang
from conftest import BACKEND
from pagealloc.sglang_radix import (EvictParams, EvictResult, InsertParams,
                                    MatchPrefixParams, RadixCache, RadixKey)
from pagealloc.sglang_radix_model import ModelPool, ModelRadixCache

try:
    import torch
except ImportError:  # pragma: no cover - depends on the host
    torch = None

pytestmark = pytest.mark.skipif(
    BACKEND == "cuda", reason="drives slots and the slab from the host "
    "(CPU backend)")

LAYOUT = "mha:layers=1,kv_heads=1,head_dim=4,dtype=fp16"


# ---- The scheduler's side: what SGLang's scheduler hands the cache.

@dataclasses.dataclass
class CacheInitParams:
    """The fields of SGLang's CacheInitParams that a RadixCache reads."""
    disable: bool
    req_to_token_pool: object
    token_to_kv_pool_allocator: object
    page_size: int
    enable_kv_cache_events: bool = False
    is_eagle: bool = False
    disable_finished_insert: bool = False
    eviction_policy: str = "lru"


class ReqToTokenPool:
    """SGLang's ReqToTokenPool as the cache uses it: a [rows, width] int64
    table of slots per request row, and write()."""

    def __init__(self, rows, width):
        if torch is not None:
            self.req_to_token = torch.zeros((rows, width), dtype=torch.int64)
        else:
            self.req_to_token = np.zeros((rows, width), dtype=np.int64)

    def write(self, index, values):
        self.req_to_token[index] = values


class Req:
    """The fields of SGLang's Req that the cache reads and writes."""

    def __init__(self, prompt, extra_key, req_pool_idx):
        self.origin_input_ids = list(prompt)
        self.output_ids = []
        self.fill_ids = []
        self.extra_key = extra_key
        self.req_pool_idx = req_pool_idx
        self.prefix_indices = []
        self.cache_protected_len = 0
        self.last_node = None
        self.kv_len = 0  # tokens whose KV has a slot

    def pop_committed_kv_cache(self):
        return self.kv_len


def listed(values):
    return [int(v) for v in (values.tolist() if hasattr(values, "tolist")
                             else values)]


def real_dump(cache):
    """RadixCache's tree in ModelRadixCache.dump's form."""
    out = []
    stack = [(c, []) for c in cache.root_node.children.values()]
    while stack:
        node, above = stack.pop()
        path = above + list(node.key.token_ids)
        out.append((repr(node.key.extra_key), tuple(path),
                    tuple(listed(node.slots)),
                    tuple(bool(s) for s in node.shared), node.lock_ref))
        stack.extend((c, path) for c in node.children.values())
    return sorted(out)


class Scheduler:
    """One scheduler: an allocator and a RadixCache on its own session, and
    its request rows."""

    def __init__(self, daemon, name, rows=4, width=64, use_reserve=True,
                 share=True):
        self.allocator = pagealloc.sglang.make_allocator(
            pagealloc.Client.connect(daemon.target, name=name),
            use_reserve=use_reserve)
        self.ps = self.allocator.page_size
        self.rows = ReqToTokenPool(rows, width)
        self.free_rows = list(range(rows))
        self.cache = RadixCache(CacheInitParams(
            False, self.rows, self.allocator, self.ps))
        if not share:
            self.cache.share = False

    @property
    def client(self):
        return self.allocator.client

    def row(self, req):
        return self.rows.req_to_token[req.req_pool_idx]

    def admit(self, prompt, extra_key=None):
        """A request whose prefix is matched and locked, its prompt's KV
        slots allocated; returns it."""
        req = Req(prompt, extra_key, self.free_rows.pop())
        match = self.cache.match_prefix(MatchPrefixParams(
            key=RadixKey(list(prompt[:-1]), extra_key)))
        req.prefix_indices = match.device_indices
        req.last_node = match.last_device_node
        req.cache_protected_len = len(req.prefix_indices)
        self.row(req)[:len(req.prefix_indices)] = self._tensor(
            listed(req.prefix_indices))
        req.kv_len = len(req.prefix_indices)
        self.cache.inc_lock_ref(req.last_node)
        self.extend(req, len(prompt))
        req.fill_ids = list(prompt)
        req.output_ids = [7]
        return req

    def extend(self, req, upto):
        """Slots for positions [req.kv_len, upto): a new page at each page
        start, the next slot of the page otherwise."""
        row = self.row(req)
        for p in range(req.kv_len, upto):
            if p % self.ps == 0:
                out = self.allocator.alloc(self.ps)
                assert out is not None, "the pool is short"
                row[p] = int(listed(out)[0])
            else:
                row[p] = row[p - 1] + 1
        req.kv_len = max(req.kv_len, upto)

    def finish(self, req):
        self.cache.cache_finished_req(req)
        self.free_rows.append(req.req_pool_idx)

    def _tensor(self, values):
        if torch is not None:
            return torch.tensor(values, dtype=torch.int64)
        return np.array(values, dtype=np.int64)

    def close(self):
        self.allocator.close()


# ---- Random traces against the statement of SGLang's RadixCache.

class ModelReq:
    def __init__(self, prompt, extra_key):
        self.origin_input_ids = list(prompt)
        self.output_ids = []
        self.fill_ids = []
        self.extra_key = extra_key
        self.prefix_indices = []
        self.cache_protected_len = 0
        self.last_node = None
        self.committed = 0


class Trace:
    """A scheduler driving RadixCache and ModelRadixCache with the same
    random requests: admissions (prefix match and lock), chunked prefills
    (cache_unfinished_req), decodes, finishes (cache_finished_req, with and
    without insert), aborts, evictions (asked for and over a budget),
    operator resets of the daemon's cache and flushes; every result, size,
    node and page count compared after each step."""

    ROWS = 8
    MAX_RUNNING = 6

    def __init__(self, daemon, page_size, use_reserve, seed, steps):
        self.daemon = daemon
        self.ps = page_size
        self.use_reserve = use_reserve
        self.rng = random.Random(seed)
        self.steps = steps
        unit = max(page_size, 4)
        self.unit = unit
        self.width = 8 * unit + 32
        self.budget = 24 * unit
        self.sched = Scheduler(daemon, "trace", rows=self.ROWS,
                               width=self.width, use_reserve=use_reserve)
        self.cache = self.sched.cache
        self.pool = ModelPool()
        self.model = ModelRadixCache(page_size, self.pool)
        self.families = [
            [self.rng.randint(1, 30) for _ in range(
                self.rng.randint(unit, 5 * unit))] for _ in range(5)]
        self.running = []  # [(req, model req, model row, state)]
        self.step = 0

    def prompt(self):
        family = self.rng.choice(self.families)
        cut = self.rng.randint(len(family) // 2, len(family))
        tail = [self.rng.randint(1, 6) for _ in range(
            self.rng.randint(1, 2 * self.unit + 2))]
        return family[:cut] + tail

    def run(self):
        ops = [(self.admit, 6), (self.chunk, 4), (self.decode, 6),
               (self.finish, 5), (self.abort, 1), (self.evict, 2),
               (self.reset_daemon_cache, 1), (self.flush, 1)]
        functions = [f for f, _ in ops]
        weights = [w for _, w in ops]
        for self.step in range(self.steps):
            self.rng.choices(functions, weights)[0]()
            self.check()
        while self.running:
            self.abort()
        self.check()
        self.cache.reset()
        self.model.reset()
        self.check()
        stats = self.sched.client.stats()
        assert stats.prefix_published_pages == 0
        if not self.use_reserve:
            assert stats.used_pages == 0
        # The next trace starts from an empty cache.
        assert pagealloc.reset_prefix_cache(self.daemon.target) == len(
            self.pool.cached)
        self.sched.close()

    def where(self, what=""):
        return "step %d %s" % (self.step, what)

    def check(self):
        cache, model = self.cache, self.model
        sizes = (cache.evictable_size(), cache.protected_size(),
                 cache.total_size())
        assert sizes == (model.evictable, model.protected, model.total()), \
            self.where("sizes")
        cache.sanity_check()
        assert real_dump(cache) == model.dump(), self.where("tree")
        stats = self.sched.client.stats()
        assert (stats.prefix_published_pages, stats.prefix_cached_pages) == (
            len(self.pool.shared), len(self.pool.cached)), self.where(
                "daemon's prefix pages")
        if not self.use_reserve:
            assert stats.used_pages == len(self.pool.own), self.where(
                "session's own pages")
        shared = sorted(self.pool.shared)
        assert listed(cache.shared_pages()) == shared, self.where()

    # ---- requests

    def _mirror_row(self, req):
        return listed(self.sched.row(req)[:req.kv_len])

    def _extend(self, req, mrow, upto):
        before = req.kv_len
        self.sched.extend(req, upto)
        row = listed(self.sched.row(req)[:upto])
        new_pages = sorted({row[p] // self.ps for p in range(before, upto)
                            if p % self.ps == 0})
        self.pool.alloc(new_pages)
        mrow[before:upto] = row[before:upto]

    def admit(self):
        if len(self.running) >= self.MAX_RUNNING:
            return
        prompt = self.prompt()
        extra = "lora-a" if self.rng.random() < 0.15 else None
        sched = self.sched
        req = Req(prompt, extra, sched.free_rows.pop())
        key = prompt[:-1]
        match = self.cache.match_prefix(MatchPrefixParams(
            key=RadixKey(list(key), extra)))
        mslots, mnode = self.model.match(key, extra)
        assert listed(match.device_indices) == mslots, self.where("match")
        req.prefix_indices = match.device_indices
        req.last_node = match.last_device_node
        req.cache_protected_len = len(mslots)
        sched.row(req)[:len(mslots)] = sched._tensor(mslots)
        req.kv_len = len(mslots)
        mreq = ModelReq(prompt, extra)
        mreq.prefix_indices = list(mslots)
        mreq.last_node = mnode
        mreq.cache_protected_len = len(mslots)
        mrow = [0] * self.width
        mrow[:len(mslots)] = mslots
        self.cache.inc_lock_ref(req.last_node)
        self.model.inc_lock(mnode)
        entry = [req, mreq, mrow, "prefill"]
        self.running.append(entry)
        if self.rng.random() < 0.5:
            self._prefill_to(entry, len(prompt))
        else:
            self.chunk(entry)

    def _prefill_to(self, entry, fill):
        req, mreq, mrow, _ = entry
        self._extend(req, mrow, fill)
        req.fill_ids = req.origin_input_ids[:fill]
        mreq.fill_ids = list(req.fill_ids)
        if fill == len(req.origin_input_ids):
            token = self.rng.randint(1, 6)
            req.output_ids = [token]
            mreq.output_ids = [token]
            entry[3] = "decode"
            return
        chunked = self.rng.random() < 0.5
        self.cache.cache_unfinished_req(req, chunked=chunked)
        mrow[:] = self.model.cache_unfinished(mreq, mrow)
        assert listed(req.prefix_indices) == mreq.prefix_indices, self.where(
            "prefix_indices")
        assert req.cache_protected_len == mreq.cache_protected_len
        assert listed(self.sched.row(req)[:req.kv_len]) == mrow[:req.kv_len]

    def chunk(self, entry=None):
        if entry is None:
            prefilling = [e for e in self.running if e[3] == "prefill"]
            if not prefilling:
                return
            entry = self.rng.choice(prefilling)
        req = entry[0]
        step = self.rng.randint(1, 2 * self.unit)
        self._prefill_to(entry, min(len(req.origin_input_ids),
                                    req.kv_len + step))

    def decode(self):
        decoding = [e for e in self.running if e[3] == "decode"]
        if not decoding:
            return
        req, mreq, mrow, _ = self.rng.choice(decoding)
        for _ in range(self.rng.randint(1, self.unit + 1)):
            if req.kv_len + 1 >= self.width:
                break
            # The last output token gets its slot; then the next is sampled.
            self._extend(req, mrow, req.kv_len + 1)
            token = self.rng.randint(1, 6)
            req.output_ids.append(token)
            mreq.output_ids.append(token)

    def finish(self):
        decoding = [e for e in self.running if e[3] == "decode"]
        if not decoding:
            return
        entry = self.rng.choice(decoding)
        self.running.remove(entry)
        req, mreq, mrow, _ = entry
        insert = self.rng.random() < 0.9
        mreq.committed = req.kv_len
        self.cache.cache_finished_req(req, is_insert=insert)
        self.model.cache_finished(mreq, mrow, insert=insert)
        self.sched.free_rows.append(req.req_pool_idx)
        self.check()
        over = self.cache.total_size() - self.budget
        if over > 0:
            assert self.cache.evict(over) == self.model.evict(over), \
                self.where("budget eviction")

    def abort(self):
        if not self.running:
            return
        entry = self.rng.choice(self.running)
        self.running.remove(entry)
        req, mreq, mrow, _ = entry
        # SGLang's release of an aborted request: its own slots past the
        # protected prefix, and its lock.
        own = listed(self.sched.row(req)[req.cache_protected_len:req.kv_len])
        pages = []
        for slot in own:
            if slot // self.ps not in pages:
                pages.append(slot // self.ps)
        if pages:
            self.sched.allocator.free_page_ids(np.array(pages))
            self.pool.free(pages)
        self.cache.dec_lock_ref(req.last_node)
        self.model.dec_lock(mreq.last_node)
        self.sched.free_rows.append(req.req_pool_idx)

    def evict(self):
        n = self.rng.randint(1, 4 * self.unit)
        result = self.cache.evict(EvictParams(num_tokens=n))
        assert isinstance(result, EvictResult)
        assert result.num_tokens_evicted == self.model.evict(n), self.where(
            "evict")

    def reset_daemon_cache(self):
        evicted = pagealloc.reset_prefix_cache(self.daemon.target)
        assert evicted == self.pool.reset_cache(), self.where("reset")

    def flush(self):
        if self.running:
            return
        self.cache.reset()
        self.model.reset()


@pytest.mark.parametrize("page_size,use_reserve", [
    (4, False), (4, True), (1, False), (16, True)])
def test_random_traces_match_the_statement_of_sglangs_radix_cache(
        make_daemon, page_size, use_reserve):
    daemon = make_daemon("--semantics=sglang", "--num_pages=8192",
                         "--page_size=%d" % page_size)
    for seed in range(2):
        Trace(daemon, page_size, use_reserve, seed=1000 * page_size + seed,
              steps=300).run()


def test_a_golden_sequence_of_hits_splits_and_evictions(make_daemon):
    """Hand-checked: a split by a shorter match, page alignment, duplicate
    frees, LRU leaf order, a parent evicted after its child, and a hit on
    the daemon's cache after the local tree evicted."""
    daemon = make_daemon("--semantics=sglang", "--num_pages=64",
                         "--page_size=4")
    s = Scheduler(daemon, "golden", use_reserve=False)
    cache = s.cache
    a = s.admit(list(range(1, 14)))        # 13 tokens: 3 pages, 1 token
    s.finish(a)                            # commits 13: 12 cached
    assert (cache.total_size(), cache.evictable_size()) == (12, 12)
    pages_a = listed(cache.shared_pages())
    assert len(pages_a) == 3
    b = s.admit(list(range(1, 9)) + [50] * 6)   # shares 2 pages of a's
    assert len(b.prefix_indices) == 8           # split at 8
    assert len(cache.root_node.children) == 1
    assert (cache.protected_size(), cache.evictable_size()) == (8, 4)
    s.finish(b)                                  # 13 committed: 12 cached
    assert cache.total_size() == 16
    # Leaves: a's [8, 12) (touched by b's match) and b's [8, 12) (newer).
    assert cache.evict(1) == 4
    assert cache.total_size() == 12
    match = cache.match_prefix(list(range(1, 14)))      # older positional
    assert len(match.device_indices) == 12               # from the daemon
    assert match.last_device_node.shared.all()
    assert cache.evict(EvictParams(num_tokens=100)).num_tokens_evicted == 16
    assert cache.total_size() == 0
    stats = s.client.stats()
    assert (stats.prefix_published_pages, stats.prefix_cached_pages) == (0, 4)
    page = listed(s.allocator.alloc(4))
    result = cache.insert(InsertParams(key=RadixKey([9, 9, 9, 9, 9]),
                                       value=page + [0]))
    assert result.prefix_len == 0 and cache.total_size() == 4
    assert listed(cache.shared_pages()) == [page[0] // 4]
    with pytest.raises(ValueError, match="needs the key's KV slots"):
        cache.insert(RadixKey([1, 2, 3, 4]))
    s.close()


# ---- Two schedulers on one daemon.

def write_pattern(client, slots, base):
    k = np.asarray(client.kv_buffer("k.0"))
    k[slots] = (np.arange(len(slots) * 4, dtype=np.float16) + base).reshape(
        len(slots), 1, 4)


def read_slots(client, slots):
    return np.asarray(client.kv_buffer("k.0"))[slots].ravel().tolist()


@pytest.fixture
def kv_daemon(make_daemon):
    return make_daemon("--semantics=sglang", "--num_pages=32",
                       "--page_size=4", "--kv_layout=" + LAYOUT)


def test_a_second_scheduler_adopts_the_first_ones_pages_and_kv(kv_daemon):
    a = Scheduler(kv_daemon, "a")
    b = Scheduler(kv_daemon, "b")
    prompt = list(range(100, 115))     # 15 tokens: 3 whole pages + 3
    ra = a.admit(prompt)
    slots = listed(a.row(ra)[:ra.kv_len])
    write_pattern(a.client, slots, base=3)
    a.finish(ra)
    published = listed(a.cache.shared_pages())
    assert published == sorted({s // 4 for s in slots[:12]})

    rb = b.admit(prompt + [1, 2, 3])
    assert listed(rb.prefix_indices) == slots[:12]   # a's pages, as a hit
    assert b.cache.total_size() == 12
    assert listed(b.cache.shared_pages()) == published
    expected = (np.arange(48, dtype=np.float16) + 3).tolist()
    assert read_slots(b.client, slots[:12]) == expected

    # a lets go in every way it can; b's pages stay its, with a's bytes.
    assert a.cache.evict(1000) == 12
    a.cache.reset()
    a.close()
    assert b.client.stats().prefix_published_pages == 3
    # Another session takes every page it can and overwrites them.
    with kv_daemon.connect(name="hog") as hog:
        free = hog.stats().free_pages
        taken = np.asarray(hog.alloc([free * 4], return_inline=True)
                           .check().slots)
        assert not set(int(p) for p in taken[::4] // 4) & set(published)
        write_pattern(hog, taken, base=-100)
        assert read_slots(b.client, slots[:12]) == expected
    b.finish(rb)
    assert b.cache.total_size() == 16
    b.cache.reset()
    assert b.client.stats().prefix_cached_pages == 4
    b.close()


def test_a_prefix_two_schedulers_computed_keeps_the_first_publisher(
        kv_daemon):
    """Both compute the same prompt before either caches it: the first
    publishes; the second's copy stays its own page, freed through its
    allocator when evicted."""
    a = Scheduler(kv_daemon, "a", use_reserve=False)
    b = Scheduler(kv_daemon, "b", use_reserve=False)
    prompt = list(range(10, 19))       # 2 whole pages + 1
    ra, rb = a.admit(prompt), b.admit(prompt)
    assert len(rb.prefix_indices) == 0
    a.finish(ra)
    b.finish(rb)
    assert len(a.cache.shared_pages()) == 2
    assert len(b.cache.shared_pages()) == 0
    assert len(b.cache.own_pages()) == 2
    used = b.client.stats().used_pages
    assert b.cache.evict(8) == 8
    assert b.client.stats().used_pages == used - 2
    # b's next match finds a's pages through the daemon.
    match = b.cache.match_prefix(MatchPrefixParams(key=RadixKey(prompt)))
    assert listed(match.device_indices) == listed(
        a.cache.all_values_flatten())
    a.close()
    b.close()


# A scheduler process: caches a 3-page prompt whose KV it wrote, says its
# slots, then waits to be killed.
WRITER = r"""
import sys
sys.path.insert(0, sys.argv[2])
from test_sglang_radix import Scheduler, listed, write_pattern

class Target:
    target = sys.argv[1]

s = Scheduler(Target, "writer")
r = s.admit(list(range(200, 214)))
slots = listed(s.row(r)[:r.kv_len])
write_pattern(s.client, slots, base=11)
s.finish(r)
print(" ".join(str(x) for x in slots[:12]), flush=True)
sys.stdin.read()
"""


def test_pages_adopted_from_a_killed_scheduler_stay_valid(kv_daemon):
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, kv_daemon.target,
         os.path.dirname(os.path.abspath(__file__))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=os.environ.copy())
    try:
        slots = [int(x) for x in child.stdout.readline().split()]
        assert len(slots) == 12
        b = Scheduler(kv_daemon, "b")
        rb = b.admit(list(range(200, 214)))
        assert listed(rb.prefix_indices) == slots
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=20)
        expected = (np.arange(48, dtype=np.float16) + 11).tolist()
        with kv_daemon.connect(name="hog") as hog:
            # The dead writer's own pages come back; its published pages
            # are b's now, whatever another session takes.
            from conftest import wait_until
            wait_until(lambda: hog.stats().sessions_active == 2,
                       what="the writer's session to end")
            taken = np.asarray(hog.alloc([hog.stats().free_pages * 4],
                                         return_inline=True).check().slots)
            assert not set(int(p) for p in taken[::4] // 4) & {
                s // 4 for s in slots}
            write_pattern(hog, taken, base=-7)
            assert read_slots(b.client, slots) == expected
        b.finish(rb)
        b.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# ---- Misuse.

def test_a_lock_released_more_often_than_taken_is_refused(make_daemon):
    daemon = make_daemon("--semantics=sglang", "--num_pages=32",
                         "--page_size=4")
    s = Scheduler(daemon, "locks")
    r = s.admit(list(range(1, 10)))
    s.finish(r)                       # releases r's lock
    node = s.cache.match_prefix(list(range(1, 10))).last_device_node
    sizes = (s.cache.evictable_size(), s.cache.protected_size())
    with pytest.raises(ValueError, match="lock_ref 0"):
        s.cache.dec_lock_ref(node)
    assert (s.cache.evictable_size(), s.cache.protected_size()) == sizes
    assert node.lock_ref == 0
    s.cache.inc_lock_ref(node)
    s.cache.dec_lock_ref(node)
    with pytest.raises(ValueError, match="lock_ref 0"):
        s.cache.dec_lock_ref(node)
    s.cache.reset()
    with pytest.raises(ValueError, match="not a node of this tree"):
        s.cache.inc_lock_ref(node)
    s.close()


def test_eviction_never_takes_a_locked_node(make_daemon):
    daemon = make_daemon("--semantics=sglang", "--num_pages=32",
                         "--page_size=4")
    s = Scheduler(daemon, "evict")
    s.finish(s.admit(list(range(1, 10))))       # caches 8 tokens
    node = s.cache.match_prefix(list(range(1, 10))).last_device_node
    s.cache.inc_lock_ref(node)
    s.finish(s.admit(list(range(20, 29))))      # 8 unlocked tokens
    assert s.cache.evict(10 ** 6) == 8
    assert s.cache.total_size() == 8
    assert s.cache.protected_size() == 8
    assert len(s.cache.match_prefix(list(range(1, 10))).device_indices) == 8
    assert s.client.stats().prefix_published_pages == 2
    s.cache.dec_lock_ref(node)
    assert s.cache.evict(10 ** 6) == 8
    s.close()


def test_the_cache_needs_a_pagealloc_allocator_and_supported_options(
        make_daemon):
    daemon = make_daemon("--semantics=sglang", "--num_pages=16",
                         "--page_size=4")
    with pytest.raises(TypeError, match="pagealloc.sglang's allocators"):
        RadixCache(None, object(), 4)
    allocator = pagealloc.sglang.make_allocator(daemon.target)
    with pytest.raises(ValueError, match="differs from the allocator's 4"):
        RadixCache(None, allocator, 8)
    with pytest.raises(NotImplementedError, match="bigram"):
        RadixCache(CacheInitParams(False, None, allocator, 4, is_eagle=True))
    with pytest.raises(ValueError, match="'lru'"):
        RadixCache(CacheInitParams(False, None, allocator, 4,
                                   eviction_policy="lfu"))
    allocator.close()


def test_page_keys_chain_whole_pages_under_their_extra_key():
    from pagealloc.prefix_keys import page_keys
    tokens = list(range(1, 12))                 # 2 whole pages of 4, and 3
    keys = page_keys(tokens, 4)
    assert len(keys) == 2 and all(len(k) == 32 for k in keys)
    # A key names the whole prefix: continuing a chain from its parent's
    # key gives the same keys as hashing from the start.
    assert page_keys(tokens[4:8], 4, parent_key=keys[0]) == keys[1:]
    assert page_keys(tokens, 4, max_pages=1) == keys[:1]
    assert page_keys(tokens, 4, extra_key="lora-a") != keys
    assert page_keys(tokens, 4, extra_key="") != keys
    assert page_keys(tokens, 4, extra_key=7) != page_keys(
        tokens, 4, extra_key="7")
    assert page_keys([5, 6, 7, 8] + tokens[4:8], 4)[1] != keys[1]
    with pytest.raises(TypeError, match="extra_key is a float"):
        page_keys(tokens, 4, extra_key=1.5)
