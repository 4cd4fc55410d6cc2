"""pagealloc.vllm.BlockPool against the re-statement of vLLM's block pool
(pagealloc/vllm_model.py) on long random scheduler traces, block for
block; two instances on one daemon sharing a cached prefix; misuse."""

import hashlib
import random
import subprocess
import sys

import numpy as np
import pytest

import pagealloc
from conftest import BACKEND, wait_until
import pagealloc.vllm as pagealloc_vllm
from pagealloc.vllm import BlockPool, KVCacheBlock
from pagealloc.vllm_model import BlockPoolModel

PAGE = 4


class Request:
    """The fields of vLLM's Request that the block pool reads."""

    def __init__(self, request_id, tokens):
        self.request_id = request_id
        self.all_token_ids = list(tokens)
        self.block_hashes = []
        self.lora_request = None
        self.update_hashes()

    def update_hashes(self):
        """vLLM-style chained block hashes of the full blocks."""
        while len(self.block_hashes) < len(self.all_token_ids) // PAGE:
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if self.block_hashes else b""
            tokens = self.all_token_ids[i * PAGE:(i + 1) * PAGE]
            self.block_hashes.append(hashlib.sha256(
                parent + repr(tokens).encode()).digest())


def as_tuple(event):
    name = type(event).__name__
    if name == "BlockStored":
        return ("stored", [bytes(h) for h in event.block_hashes],
                None if event.parent_block_hash is None
                else bytes(event.parent_block_hash),
                list(event.token_ids), event.block_size, event.lora_id)
    if name == "BlockRemoved":
        return ("removed", [bytes(h) for h in event.block_hashes])
    assert name == "AllBlocksCleared", name
    return ("cleared",)


class Twin:
    """Drives the model and the pool with the same scheduler calls and
    checks that they agree after each: blocks (through the map from the
    model's ids to the pool's pages, set where both hand out new blocks),
    reference counts, hashes, hits and events."""

    def __init__(self, pool, model):
        self.pool, self.model = pool, model
        self.to_page = {}
        self.running = {}
        self.allocated = 0
        self.hits = 0

    def room(self):
        """The most blocks the trace may ever take for neither pool to
        evict: vLLM evicts once its queue's never-used blocks run out, the
        daemon once the free list cannot serve a refill, and the reserve
        holds at most a quarter of the pool besides what vLLM took."""
        return (self.model.num_gpu_blocks - 1) * 3 // 4 - 1

    def lookup(self, request):
        found_m, found_p = [], []
        for block_hash in request.block_hashes:
            m = self.model.get_cached_block(block_hash, [0])
            p = self.pool.get_cached_block(block_hash, [0])
            assert (m is None) == (p is None), (
                "model hit %s, pool hit %s" % (m, p))
            if m is None:
                break
            assert self.to_page[m[0].block_id] == p[0].block_id
            found_m.append(m[0])
            found_p.append(p[0])
        return found_m, found_p

    def admit(self, request, never_evict):
        hits_m, hits_p = self.lookup(request)
        total = -(-len(request.all_token_ids) // PAGE)
        need = total - len(hits_m)
        evictable = sum(1 for b in hits_m if b.ref_cnt == 0)
        if need > self.model.get_num_free_blocks() - evictable or (
                never_evict and self.allocated + need > self.room()):
            return False
        self.hits += len(hits_m)
        self.model.touch(hits_m)
        self.pool.touch(hits_p)
        new_m = self.model.get_new_blocks(need)
        new_p = self.pool.get_new_blocks(need)
        self.allocated += need
        for m, p in zip(new_m, new_p):
            self.to_page[m.block_id] = p.block_id
        blocks_m, blocks_p = hits_m + new_m, hits_p + new_p
        full = len(request.all_token_ids) // PAGE
        self.cache(request, blocks_m, blocks_p, len(hits_m), full)
        self.running[request.request_id] = [request, blocks_m, blocks_p, full]
        return True

    def cache(self, request, blocks_m, blocks_p, cached, full):
        self.model.cache_full_blocks(request.block_hashes,
                                     request.all_token_ids, None, blocks_m,
                                     cached, full, PAGE, 0)
        self.pool.cache_full_blocks(request, blocks_p, cached, full, PAGE, 0)

    def decode(self, request_id, token, never_evict):
        entry = self.running[request_id]
        request, blocks_m, blocks_p, cached = entry
        if len(request.all_token_ids) == len(blocks_m) * PAGE:
            if self.model.get_num_free_blocks() < 1 or (
                    never_evict and self.allocated + 1 > self.room()):
                return
            m, = self.model.get_new_blocks(1)
            p, = self.pool.get_new_blocks(1)
            self.allocated += 1
            self.to_page[m.block_id] = p.block_id
            blocks_m.append(m)
            blocks_p.append(p)
        request.all_token_ids.append(token)
        request.update_hashes()
        full = len(request.all_token_ids) // PAGE
        self.cache(request, blocks_m, blocks_p, cached, full)
        entry[3] = full

    def finish(self, request_id):
        _, blocks_m, blocks_p, _ = self.running.pop(request_id)
        self.model.free_blocks(reversed(blocks_m))
        self.pool.free_blocks(reversed(blocks_p))

    def check(self):
        self.pool.publish_pending()
        assert ([as_tuple(e) for e in self.pool.take_events()] ==
                self.model.take_events())
        in_use = self.model.num_gpu_blocks - 1 - \
            self.model.get_num_free_blocks()
        assert self.pool.num_blocks_in_use() == in_use
        for _, blocks_m, blocks_p, _ in self.running.values():
            for m, p in zip(blocks_m, blocks_p):
                assert self.to_page[m.block_id] == p.block_id
                assert p.ref_cnt == m.ref_cnt
                assert p.block_hash == m.block_hash


def prompt(rng, prefixes):
    tokens = list(rng.choice(prefixes))
    tokens += [rng.randrange(1000) for _ in range(rng.randrange(0, 9))]
    return tokens or [rng.randrange(1000)]


def run_trace(pool, seed, steps):
    model = BlockPoolModel(pool.num_gpu_blocks, enable_kv_cache_events=True)
    twin = Twin(pool, model)
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.choice([4, 8, 13]))]
                for _ in range(4)]
    for step in range(steps):
        op = rng.random()
        if op < 0.35 or not twin.running:
            twin.admit(Request("r%d" % step, prompt(rng, prefixes)),
                       never_evict=True)
        elif op < 0.75:
            twin.decode(rng.choice(sorted(twin.running)), rng.randrange(1000),
                        never_evict=True)
        else:
            twin.finish(rng.choice(sorted(twin.running)))
        if not twin.running and rng.random() < 0.3:
            assert pool.reset_prefix_cache() == model.reset_prefix_cache()
        twin.check()
        if step % 25 == 0:
            assert pool.get_num_free_blocks() <= model.get_num_free_blocks()
    while twin.running:
        twin.finish(sorted(twin.running)[0])
        twin.check()
    return twin


@pytest.fixture
def big_daemon(make_daemon):
    return make_daemon("--num_pages=1023", "--page_size=%d" % PAGE)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_instance_matches_vllm_block_for_block(big_daemon, seed):
    with BlockPool(big_daemon.target, enable_kv_cache_events=True) as pool:
        assert pool.num_gpu_blocks == 1024
        assert pool.null_block.block_id == 0 and pool.null_block.is_null
        twin = run_trace(pool, seed, steps=800)
        assert twin.hits > 200  # the trace exercises the prefix cache
        assert pool.num_blocks_in_use() == 0
        # Every cached block of the trace is still hit-able after the
        # requests are gone, as in vLLM's pool.
        assert pool.get_usage() >= 0.0


def test_two_instances_share_a_cached_prefix(big_daemon):
    tokens = list(range(100, 112))  # three full blocks
    first = BlockPool(big_daemon.target, enable_kv_cache_events=True,
                      name="vllm-0")
    with BlockPool(big_daemon.target, name="vllm-1") as second:
        request = Request("a", tokens)
        blocks = first.get_new_blocks(3)
        first.cache_full_blocks(request, blocks, 0, 3, PAGE, 0)
        assert [as_tuple(e)[0] for e in first.take_events()] == ["stored"]
        # Not published until the step that writes the KV is done.
        assert second.get_cached_block(request.block_hashes[0], [0]) is None
        assert first.publish_pending() == 3
        hits = [second.get_cached_block(h, [0])[0]
                for h in request.block_hashes]
        assert [b.block_id for b in hits] == [b.block_id for b in blocks]
        second.touch(hits)
        assert [b.ref_cnt for b in hits] == [1, 1, 1]
        # The first instance dies holding them: they stay cached.
        first.client.close()
        second.free_blocks(reversed(hits))
        with BlockPool(big_daemon.target, name="vllm-2") as third:
            again = third.get_cached_block(request.block_hashes[2], [0])
            assert again[0].block_id == blocks[2].block_id
            third.touch(again)
            third.free_blocks(again)
    first.close()


def test_misuse_is_refused_and_changes_nothing(big_daemon):
    with BlockPool(big_daemon.target) as pool, \
            BlockPool(big_daemon.target) as other:
        blocks = pool.get_new_blocks(2)
        pool.free_blocks(blocks[:1])
        with pytest.raises(ValueError, match=r"block %d has ref_cnt 0 and "
                           r"is freed 1 times" % blocks[0].block_id):
            pool.free_blocks([blocks[1], blocks[0]])
        assert blocks[1].ref_cnt == 1
        with pytest.raises(ValueError, match="ref_cnt 1 and is freed 2"):
            pool.free_blocks([blocks[1], blocks[1]])
        theirs, = other.get_new_blocks(1)
        for bad in (theirs, KVCacheBlock(blocks[1].block_id), "7"):
            with pytest.raises(ValueError, match="not a block of this pool"):
                pool.free_blocks([bad])
            with pytest.raises(ValueError, match="not a block of this pool"):
                pool.touch([bad])
        with pytest.raises(ValueError, match="is free and not cached"):
            pool.touch([blocks[0]])
        with pytest.raises(ValueError, match="Cannot get 5000 free blocks"):
            pool.get_new_blocks(5000)
        with pytest.raises(ValueError, match="block id 1024 is not in"):
            pool.evict_blocks({1024})
        assert blocks[1].ref_cnt == 1 and theirs.ref_cnt == 1
        assert pool.num_blocks_in_use() == 1
        assert not pool.reset_prefix_cache()  # a block is in use
        pool.free_blocks(blocks[1:])
        assert pool.reset_prefix_cache()
        assert pool.num_blocks_in_use() == 0
        with pytest.raises(ValueError, match="num_gpu_blocks is 10"):
            BlockPool(big_daemon.target, num_gpu_blocks=10)


def test_evict_blocks_drops_the_hash_here(big_daemon):
    with BlockPool(big_daemon.target, enable_kv_cache_events=True) as pool:
        request = Request("a", list(range(8)))
        blocks = pool.get_new_blocks(2)
        pool.cache_full_blocks(request, blocks, 0, 2, PAGE, 0)
        pool.take_events()
        pool.evict_blocks({blocks[1].block_id})
        assert blocks[1].block_hash is None and blocks[1].ref_cnt == 1
        assert [as_tuple(e) for e in pool.take_events()] == [
            ("removed", [request.block_hashes[1]])]
        assert pool.publish_pending() == 1  # only the block still cached
        assert pool.get_cached_block(request.block_hashes[1], [0]) is None
        pool.free_blocks(reversed(blocks))


def test_the_model_evicts_in_vllms_order():
    """Hand-checked: the free queue's front is reused first, a freed block
    stays hit-able until it is reused, and reuse evicts it."""
    model = BlockPoolModel(5)
    a = model.get_new_blocks(2)
    assert [b.block_id for b in a] == [1, 2]
    request = Request("a", range(8))
    model.cache_full_blocks(request.block_hashes, request.all_token_ids,
                            None, a, 0, 2, PAGE, 0)
    model.free_blocks(reversed(a))  # block 2 first to be evicted
    assert model.get_num_free_blocks() == 4
    assert model.get_cached_block(request.block_hashes[0], [0])[0] is a[0]
    b = model.get_new_blocks(3)
    assert [x.block_id for x in b] == [3, 4, 2]
    assert model.get_cached_block(request.block_hashes[1], [0]) is None
    assert model.get_cached_block(request.block_hashes[0], [0])[0] is a[0]
    assert model.take_events() == [
        ("stored", request.block_hashes[:2], None, list(range(8)), PAGE,
         None), ("removed", [request.block_hashes[1]])]
    assert not model.reset_prefix_cache()


LAYOUT = "mha:layers=1,kv_heads=1,head_dim=4,dtype=fp16"


def pattern(block_hash):
    """What a block's KV is in the slab: its hash's first bytes."""
    return np.frombuffer(block_hash[:PAGE * 4], dtype=np.uint8).astype(
        np.float16).reshape(PAGE, 1, 4)


@pytest.mark.skipif(BACKEND == "cuda",
                    reason="reads the slab from the host (CPU backend)")
def test_instances_on_a_tight_pool_hit_only_the_right_kv(make_daemon):
    """Three instances on a pool too small for their prefixes: the daemon
    evicts cached pages (its LRU, not vLLM's queue), every hit holds the
    KV its publisher wrote for that hash, counts follow the requests, and
    a refused get_new_blocks takes nothing."""
    daemon = make_daemon("--num_pages=24", "--page_size=%d" % PAGE,
                         "--kv_layout=" + LAYOUT)
    rng = random.Random(7)
    prefixes = [[rng.randrange(1000) for _ in range(12)] for _ in range(6)]
    pools = [BlockPool(daemon.target, reserve_batch=1, name="vllm-%d" % i,
                       enable_kv_cache_events=True) for i in range(3)]
    kv = [np.asarray(p.client.kv_buffer("k.0")) for p in pools]
    running = []  # (pool index, request, blocks)
    hits = refused = evicted = 0
    try:
        for step in range(300):
            i = rng.randrange(3)
            pool = pools[i]
            if running and rng.random() < 0.45:
                j, _, blocks = running.pop(rng.randrange(len(running)))
                pools[j].free_blocks(reversed(blocks))
            else:
                request = Request("r%d" % step, rng.choice(prefixes) +
                                  [rng.randrange(1000)])
                found = []
                for block_hash in request.block_hashes:
                    got = pool.get_cached_block(block_hash, [0])
                    if got is None:
                        break
                    block = got[0]
                    view = kv[i][block.block_id * PAGE:
                                 (block.block_id + 1) * PAGE]
                    assert (view == pattern(block_hash)).all()
                    found.append(block)
                pool.touch(found)
                need = 4 - len(found)
                pool.take_events()
                try:
                    new = pool.get_new_blocks(need)
                except ValueError:
                    refused += 1
                    pool.free_blocks(reversed(found))
                    continue
                # A page this pool let go cached, evicted by the daemon's
                # LRU and handed back: its hash leaves with a BlockRemoved.
                evicted += sum(type(e).__name__ == "BlockRemoved"
                               for e in pool.take_events())
                hits += len(found)
                blocks = found + new
                for k, block in enumerate(new):
                    if len(found) + k < 3:
                        page = block.block_id
                        kv[i][page * PAGE:(page + 1) * PAGE] = pattern(
                            request.block_hashes[len(found) + k])
                pool.cache_full_blocks(request, blocks, len(found), 3, PAGE,
                                       0)
                pool.publish_pending()
                running.append((i, request, blocks))
            held = {}
            for j, _, blocks in running:
                for block in blocks:
                    held[(j, block.block_id)] = held.get(
                        (j, block.block_id), 0) + 1
            for j, p in enumerate(pools):
                for block in p.blocks[1:]:
                    assert block.ref_cnt == held.get((j, block.block_id), 0)
        assert hits > 50 and refused > 0 and evicted > 10
    finally:
        for p in pools:
            p.close()


def test_the_factory_takes_vllms_constructor_arguments(big_daemon):
    make = pagealloc_vllm.block_pool_factory(big_daemon.target,
                                             name="vllm-factory")
    with make(1024, True, PAGE, True, None) as pool:
        assert pool.enable_kv_cache_events and pool.hash_block_size == PAGE
        assert pool.num_blocks_in_use() == 0
        blocks = pool.get_new_blocks(3)
        # Never more than exact (the reserve's refills can be in flight).
        assert pool.get_num_free_blocks() <= 1020
        assert pool.get_usage() * 1023 >= 3 - 1e-9
        pool.free_blocks(blocks)
    with pytest.raises(ValueError, match="hash_block_size is 8"):
        make(1024, True, 8)


_KILLED_WRITER = r"""
import sys
import numpy as np
from pagealloc.vllm import BlockPool

class Request:
    pass

request = Request()
request.block_hashes = [bytes.fromhex(h) for h in sys.argv[2:]]
request.all_token_ids = list(range(4 * len(request.block_hashes)))
request.lora_request = None
pool = BlockPool(sys.argv[1], name="writer")
blocks = pool.get_new_blocks(len(request.block_hashes))
kv = np.asarray(pool.client.kv_buffer("k.0"))
for block, block_hash in zip(blocks, request.block_hashes):
    kv[block.block_id * 4:(block.block_id + 1) * 4] = np.frombuffer(
        block_hash[:16], dtype=np.uint8).astype(np.float16).reshape(4, 1, 4)
pool.cache_full_blocks(request, blocks, 0, len(blocks), 4, 0)
assert pool.publish_pending() == len(blocks)
print(" ".join(str(b.block_id) for b in blocks), flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(BACKEND == "cuda",
                    reason="reads the slab from the host (CPU backend)")
def test_a_killed_instances_cached_blocks_serve_the_next(make_daemon):
    daemon = make_daemon("--num_pages=16", "--page_size=%d" % PAGE,
                         "--kv_layout=" + LAYOUT)
    request = Request("a", range(12))
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, daemon.target] +
        [h.hex() for h in request.block_hashes],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pages = [int(x) for x in child.stdout.readline().split()]
        assert len(pages) == 3
        child.kill()  # SIGKILL: no free, no close
        child.wait(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with BlockPool(daemon.target, name="successor") as pool:
        wait_until(lambda: pool.client.stats().sessions_active == 1,
                   what="the daemon to reclaim the killed session")
        kv = np.asarray(pool.client.kv_buffer("k.0"))
        hits = [pool.get_cached_block(h, [0]) for h in request.block_hashes]
        assert [b[0].block_id for b in hits] == pages
        for (block,), block_hash in zip(hits, request.block_hashes):
            view = kv[block.block_id * PAGE:(block.block_id + 1) * PAGE]
            assert (view == pattern(block_hash)).all()
        pool.touch([b[0] for b in hits])
        pool.free_blocks(reversed([b[0] for b in hits]))


def test_a_hit_given_back_before_touch_is_adopted_again(make_daemon):
    daemon = make_daemon("--num_pages=4", "--page_size=%d" % PAGE)
    request = Request("a", range(4))
    with BlockPool(daemon.target, reserve_batch=1) as writer, \
            BlockPool(daemon.target, reserve_batch=1) as reader:
        block, = writer.get_new_blocks(1)
        writer.cache_full_blocks(request, [block], 0, 1, PAGE, 0)
        writer.publish_pending()
        writer.free_blocks([block])  # cached on the daemon, held by none
        hit, = reader.get_cached_block(request.block_hashes[0], [0])
        assert hit.block_id == block.block_id and hit.ref_cnt == 0
        reader.free_blocks(reader.get_new_blocks(1))  # gives the hit back
        reader.touch([hit])  # adopted again: still cached
        assert hit.ref_cnt == 1
        reader.free_blocks([hit])
        # Evicted on the daemon (the operator's reset) in between: a touch
        # of the stale block is refused, changing nothing.
        hit, = reader.get_cached_block(request.block_hashes[0], [0])
        reader.get_new_blocks(0)  # gives the hit back
        assert pagealloc.reset_prefix_cache(daemon.target) == 1
        with pytest.raises(ValueError, match="was evicted from the daemon"):
            reader.touch([hit])
        assert hit.ref_cnt == 0 and reader.num_blocks_in_use() == 0
