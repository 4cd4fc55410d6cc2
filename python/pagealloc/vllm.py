"""vLLM v1's block pool on a pagealloc daemon (docs/python.md, "vLLM").

``BlockPool`` has the interface and return conventions of vLLM's
``vllm/v1/core/block_pool.py`` ``BlockPool`` as its ``KVCacheManager``
calls it; blocks are the daemon's pages (block id == page id, block 0 the
null block: the daemon never hands out page 0), new blocks come from the
session's page reserve, and the prefix cache is the daemon's shared index,
so that several vLLM instances on one GPU hit each other's cached blocks:

    pool = pagealloc.vllm.BlockPool("unix:///run/pagealloc/gpu0.sock",
                                    enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(request, blocks, 0, 4, block_size, 0)
    ...                       # the step's forward pass writes their KV
    pool.publish_pending()    # now the other instances may hit them

How the two pools differ (one process against many) is in docs/python.md.
"""

import dataclasses
import hashlib
import logging
from typing import List, Optional

import pagealloc
from pagealloc._compat import with_known_fields
from pagealloc.client import PREFIX_KEY_BYTES
from pagealloc.errors import ResourceExhaustedError

logger = logging.getLogger(__name__)

try:  # vLLM's own classes when vLLM is installed, so its code sees its own.
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
except ImportError:  # pragma: no cover - exercised where vLLM is absent
    KVCacheBlock = None

try:
    from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved,
                                            BlockStored)
except ImportError:
    AllBlocksCleared = BlockRemoved = BlockStored = None

if KVCacheBlock is None:

    @dataclasses.dataclass(eq=False)
    class KVCacheBlock:
        """The fields of vLLM's KVCacheBlock (kv_cache_utils.py) that its
        manager reads: the id, the reference count, the hash (with its KV
        cache group id) and whether this is the null block."""
        block_id: int
        ref_cnt: int = 0
        _block_hash: Optional[bytes] = None
        prev_free_block: Optional["KVCacheBlock"] = None
        next_free_block: Optional["KVCacheBlock"] = None
        is_null: bool = False

        @property
        def block_hash(self):
            return self._block_hash

        @block_hash.setter
        def block_hash(self, block_hash):
            assert self._block_hash is None, (
                "The block already has a hash. This should not happen.")
            self._block_hash = block_hash

        def reset_hash(self):
            self._block_hash = None

if BlockStored is None:

    @dataclasses.dataclass
    class BlockStored:
        """vLLM's BlockStored event (vllm/distributed/kv_events.py)."""
        block_hashes: list
        parent_block_hash: Optional[bytes]
        token_ids: list
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str] = "GPU"
        lora_name: Optional[str] = None

    @dataclasses.dataclass
    class BlockRemoved:
        """vLLM's BlockRemoved event."""
        block_hashes: list
        medium: Optional[str] = "GPU"

    @dataclasses.dataclass
    class AllBlocksCleared:
        """vLLM's AllBlocksCleared event."""


def hash_with_group(block_hash, group_id):
    """vLLM's BlockHashWithGroupId: the block hash's bytes, then the KV
    cache group id as 4 big-endian bytes (make_block_hash_with_group_id)."""
    return bytes(block_hash) + int(group_id).to_bytes(4, "big")


def daemon_key(block_hash_with_group):
    """The daemon's 32-byte prefix key of a block: the SHA-256 of its
    BlockHashWithGroupId bytes. Fixed-size for any of vLLM's hash
    functions (sha256, sha256_cbor, xxhash), and the group id is part of
    it, so two groups' blocks of one token chain never share a page."""
    key = hashlib.sha256(bytes(block_hash_with_group)).digest()
    assert len(key) == PREFIX_KEY_BYTES
    return key


# A block's place in this pool (no entry: the pool knows nothing of it).
_OWNED = "owned"        # the session's page from the reserve, unpublished
_SHARED = "shared"      # a shared page the session holds one reference on
_RELEASED = "released"  # a shared page let go; cached in the daemon, maybe


def _flatten(blocks):
    """touch's argument: a flat sequence of blocks, or one per KV group."""
    for item in blocks:
        if isinstance(item, KVCacheBlock):
            yield item
        else:
            yield from item


class BlockPool:
    """vLLM's BlockPool over a pagealloc daemon (docs/python.md, "vLLM").

    num_gpu_blocks is the daemon's pages + 1 (the null block); passing
    another number is a ValueError. hash_block_size defaults to the pool's
    page size, and blocks are pages, so the manager's block size must be
    the daemon's page size. `client` is a connected pagealloc.Client of
    `target` to use (the pool makes its own session otherwise); the pool
    closes only what it made.
    """

    def __init__(self, target, num_gpu_blocks=None, enable_caching=True,
                 hash_block_size=None, enable_kv_cache_events=False, *,
                 client=None, name="vllm", reserve_batch=None,
                 publish_on_cache=False):
        self._target = target
        self._own_client = client is None
        self.client = client or pagealloc.Client.connect(target, name=name)
        pool = self.client.pool
        if num_gpu_blocks is not None and num_gpu_blocks != pool.num_pages + 1:
            raise ValueError(
                "num_gpu_blocks is %d; the daemon's pool has %d pages, so "
                "%d blocks with the null block" %
                (num_gpu_blocks, pool.num_pages, pool.num_pages + 1))
        self.num_gpu_blocks = pool.num_pages + 1
        self.block_size = pool.page_size
        self.hash_block_size = hash_block_size or pool.page_size
        if self.hash_block_size != pool.page_size:
            raise ValueError(
                "hash_block_size is %d; a block is one of the daemon's pages "
                "of %d tokens" % (self.hash_block_size, pool.page_size))
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.publish_on_cache = publish_on_cache
        self.reserve = self.client.reserve(initial_batch=reserve_batch)
        self.blocks: List[KVCacheBlock] = [
            KVCacheBlock(i) for i in range(self.num_gpu_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        self.kv_event_queue = []
        self._state = {}        # block id -> _OWNED / _SHARED / _RELEASED
        self._index = {}        # hash with group -> a held block
        self._untouched = {}    # adopted by a lookup, not yet touched
        self._pending = []      # [(blocks, parent key)] to publish

    # ---- vLLM's interface.

    def get_cached_block(self, block_hash, kv_cache_group_ids):
        """One cached block per group, or None when any group misses. A
        block this pool holds is found here; any other comes from the
        daemon's index, adopted (a reference for this session, atomically
        with the match, so no eviction comes between it and touch). Blocks
        a lookup adopted that touch does not take go back at the next
        get_new_blocks."""
        found = []
        for group_id in kv_cache_group_ids:
            key = hash_with_group(block_hash, group_id)
            block = self._index.get(key)
            if block is None:
                block = self._adopt(key)
            if block is None:
                return None
            found.append(block)
        return found

    def get_new_blocks(self, num_blocks):
        """`num_blocks` new blocks of reference count 1, from the session's
        page reserve. ValueError, taking nothing, when the daemon cannot
        supply them (another instance may have taken what
        get_num_free_blocks counted)."""
        self._give_back_untouched()
        if num_blocks == 0:
            return []
        try:
            pages = self.reserve.take(num_blocks)
        except ResourceExhaustedError as e:
            raise ValueError("Cannot get %d free blocks from the pool: %s" %
                             (num_blocks, e)) from e
        taken = []
        for page in pages.tolist():
            block = self.blocks[page]
            state = self._state.get(page)
            if state == _RELEASED:
                # The daemon evicted this cached page and handed it back.
                self._forget_hash(block)
            elif state is not None:
                raise pagealloc.InternalError(
                    "the daemon handed out page %d, which this pool holds "
                    "(%s, ref_cnt %d)" % (page, state, block.ref_cnt))
            block.ref_cnt = 1
            self._state[page] = _OWNED
            taken.append(block)
        return taken

    def touch(self, blocks):
        """Takes one reference on each block (a flat sequence, or one per
        KV cache group). A cached block that a lookup adopted is taken as
        is; one let go since is adopted again. ValueError, changing
        nothing, for a block not of this pool or evicted meanwhile."""
        flat = list(_flatten(blocks))
        for block in flat:
            self._check_ours(block, "touch")
        readopted = []
        try:
            for block in flat:
                if (block.ref_cnt == 0 and not block.is_null and
                        self._state.get(block.block_id) != _SHARED and
                        block.block_id not in readopted):
                    self._readopt(block)
                    readopted.append(block.block_id)
        except Exception:
            for page in readopted:
                self._drop_shared(self.blocks[page])
            raise
        for block in flat:
            self._untouched.pop(block.block_id, None)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks):
        """Drops one reference per block given, in eviction order (the
        first given is to be evicted first). A block whose count reaches 0
        goes back: an unpublished page to the reserve, a shared one to the
        daemon, where it stays cached for every instance until its LRU
        evicts it. ValueError, changing nothing, for a block not of this
        pool or freed more often than it is held."""
        blocks = list(ordered_blocks)
        counts = {}
        for block in blocks:
            self._check_ours(block, "free_blocks")
            if not block.is_null:
                counts[block.block_id] = counts.get(block.block_id, 0) + 1
        for page, count in counts.items():
            held = self.blocks[page].ref_cnt
            if count > held:
                raise ValueError(
                    "free_blocks: block %d has ref_cnt %d and is freed %d "
                    "times; nothing was freed" % (page, held, count))
        for block in blocks:
            block.ref_cnt -= 1
        done = list({b.block_id: b for b in blocks
                     if b.ref_cnt == 0 and not b.is_null}.values())
        owned = [b for b in done if self._state[b.block_id] == _OWNED]
        shared = [b for b in done if self._state[b.block_id] == _SHARED]
        for block in owned:
            # Its page is reused; a hash it had (a publish not made yet, or
            # a duplicate of a published key) leaves with it.
            self._unpend(block)
            self._forget_hash(block)
            del self._state[block.block_id]
        if owned:
            self.reserve.put([b.block_id for b in owned])
        if shared:
            # The daemon enters the pages one free makes cached into its
            # LRU last page first: reversed, vLLM's first is evicted first.
            self.client.free_pages([b.block_id for b in reversed(shared)])
            for block in shared:
                self._unindex(block)
                self._state[block.block_id] = _RELEASED

    def cache_full_blocks(self, request, blocks, num_cached_blocks,
                          num_full_blocks, block_size, kv_cache_group_id):
        """Gives blocks [num_cached_blocks, num_full_blocks) of `request`
        its block hashes (request.block_hashes) and indexes them here at
        once; their pages are published to the daemon by
        publish_pending(), once the step that writes their KV is done
        (with publish_on_cache, here). A BlockStored event names them."""
        if num_cached_blocks >= num_full_blocks:
            return
        if block_size != self.hash_block_size:
            raise NotImplementedError(
                "block_size %d: a block is one of the daemon's pages of %d "
                "tokens" % (block_size, self.hash_block_size))
        block_hashes = request.block_hashes
        if len(block_hashes) < num_full_blocks:
            raise ValueError(
                "the request has %d block hashes; %d full blocks need one "
                "each" % (len(block_hashes), num_full_blocks))
        new_full = blocks[num_cached_blocks:num_full_blocks]
        for block in new_full:
            self._check_ours(block, "cache_full_blocks")
            if not block.is_null and (block.block_hash is not None or
                                      block.ref_cnt <= 0):
                raise ValueError(
                    "cache_full_blocks: block %d (ref_cnt %d) is %s" %
                    (block.block_id, block.ref_cnt,
                     "cached already" if block.block_hash is not None
                     else "free"))
        to_publish, new_hashes = [], []
        for i, block in enumerate(new_full):
            if block.is_null:
                continue
            block_hash = block_hashes[num_cached_blocks + i]
            key = hash_with_group(block_hash, kv_cache_group_id)
            block.block_hash = key
            self._index.setdefault(key, block)
            if self._state[block.block_id] == _OWNED:
                to_publish.append(block)
            new_hashes.append(self._external(block_hash))
        parent = None
        if num_cached_blocks:
            parent = hash_with_group(block_hashes[num_cached_blocks - 1],
                                     kv_cache_group_id)
        if to_publish:
            self._pending.append((to_publish, parent))
        if self.enable_kv_cache_events:
            lora = getattr(request, "lora_request", None)
            self.kv_event_queue.append(with_known_fields(
                BlockStored, block_hashes=new_hashes,
                parent_block_hash=(self._external(
                    block_hashes[num_cached_blocks - 1])
                    if num_cached_blocks else None),
                token_ids=list(request.all_token_ids[
                    num_cached_blocks * block_size:
                    num_full_blocks * block_size]),
                block_size=block_size,
                lora_id=getattr(lora, "adapter_id",
                                getattr(lora, "id", None)) if lora else None,
                medium="GPU",
                lora_name=getattr(lora, "name", None) if lora else None))
        if self.publish_on_cache:
            self.publish_pending()

    def publish_pending(self):
        """Publishes the pages cache_full_blocks named since the last call
        (those still held), so that every session of the daemon may hit
        them. Call it once the GPU work that writes their KV is done: the
        other sessions may read a page as soon as it is published. A key
        another session published first keeps that session's page; this
        block stays this pool's own (and its hash local). Returns the
        pages published."""
        pending, self._pending = self._pending, []
        published = 0
        for blocks, parent in pending:
            blocks = [b for b in blocks
                      if self._state.get(b.block_id) == _OWNED and
                      b.block_hash is not None]
            if not blocks:
                continue
            pages, existing = self.client.publish(
                [b.block_id for b in blocks],
                [daemon_key(b.block_hash) for b in blocks],
                parent_key=daemon_key(parent) if parent else None)
            for block, page, old in zip(blocks, pages.tolist(),
                                        existing.tolist()):
                if not old:
                    self._state[block.block_id] = _SHARED
                    published += 1
        return published

    def evict_blocks(self, block_ids):
        """Drops the given blocks from this pool's prefix cache (their
        counts unchanged), a BlockRemoved event for each that had a hash.
        A page published to the daemon stays in the daemon's index until
        its LRU evicts it. ValueError, changing nothing, for an id out of
        range."""
        ids = list(block_ids)
        for block_id in ids:
            if not 0 <= block_id < self.num_gpu_blocks:
                raise ValueError(
                    "evict_blocks: block id %d is not in 0..%d" %
                    (block_id, self.num_gpu_blocks - 1))
        for block_id in ids:
            block = self.blocks[block_id]
            self._unpend(block)
            self._forget_hash(block)
            if self._state.get(block_id) == _RELEASED:
                del self._state[block_id]

    def reset_prefix_cache(self):
        """Clears the prefix cache: this pool's hashes and the daemon's
        cached, unpinned pages (every instance's: the cache is shared).
        False, changing nothing, while any block is in use, as vLLM."""
        used = sum(1 for b in self.blocks[1:] if b.ref_cnt > 0)
        if used:
            logger.warning("Failed to reset prefix cache because some "
                           "blocks (%d) are not freed yet", used)
            return False
        self._give_back_untouched()
        self._pending = []
        self._index = {}
        for block in self.blocks:
            block.reset_hash()
        self._state = {k: v for k, v in self._state.items()
                       if v != _RELEASED}
        pagealloc.reset_prefix_cache(self._target)
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(with_known_fields(AllBlocksCleared))
        return True

    def get_num_free_blocks(self):
        """The blocks vLLM may count on: the daemon's free, parked and
        evictable pages and the reserve's. Across processes a snapshot (another
        instance may take them first; get_new_blocks then raises);
        for one instance exact while its reserve is idle. Shared pages count
        when no session holds them (the daemon's evictable pages) or when
        this instance holds one with no request on it (vLLM's cached free
        block; another session may hold it too, and then it stays)."""
        # The reserve's thread moves pages between the daemon and the
        # reserve: a move between the two reads would count its pages
        # twice. Reserve counts unchanged around the daemon's figures leave
        # only a move still in flight, which counts low.
        for _ in range(8):
            before = self.reserve.stats()
            stats = self.client.stats()
            after = self.reserve.stats()
            if before == after:
                break
        idle = sum(1 for page, state in self._state.items()
                   if state == _SHARED and self.blocks[page].ref_cnt == 0)
        free = (stats.free_pages + stats.parked_pages + after["pages"] +
                stats.prefix_evictable_pages + idle)
        return max(0, min(free, self.num_gpu_blocks - 1))

    def get_usage(self):
        """The KV cache usage, between 0.0 and 1.0."""
        total = self.num_gpu_blocks - 1
        if not total:
            return 0
        return 1.0 - self.get_num_free_blocks() / total

    def take_events(self):
        """This pool's events since the last call, in vLLM's classes
        (BlockStored, BlockRemoved, AllBlocksCleared): what this instance
        did. The daemon's KV event stream is the cross-process feed."""
        if not self.enable_kv_cache_events:
            return []
        events, self.kv_event_queue = self.kv_event_queue, []
        return events

    # ---- Beyond vLLM's interface.

    def num_blocks_in_use(self):
        """The blocks with references, the null block aside."""
        return sum(1 for b in self.blocks[1:] if b.ref_cnt > 0)

    def close(self):
        """Gives every page back (the session's end would too) and closes
        what the pool made. Closing twice is fine."""
        if self.client is None:
            return
        held = [p for p, s in self._state.items() if s == _SHARED]
        if held and self.client.alive:
            self.client.free_pages(held)
        self._state, self._index, self._untouched = {}, {}, {}
        self.reserve.close()
        if self._own_client:
            self.client.close()
        self.client = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- Internals.

    def _check_ours(self, block, what):
        block_id = getattr(block, "block_id", None)
        if (not isinstance(block_id, int) or
                not 0 <= block_id < self.num_gpu_blocks or
                self.blocks[block_id] is not block):
            raise ValueError(
                "%s: %r is not a block of this pool (block ids 0..%d); "
                "nothing was changed" %
                (what, block, self.num_gpu_blocks - 1))

    def _external(self, block_hash):
        return bytes(block_hash)

    def _forget_hash(self, block):
        if block.block_hash is None:
            return
        self._unindex(block)
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(with_known_fields(
                BlockRemoved, block_hashes=[self._external(
                    block.block_hash[:-4])], medium="GPU"))
        block.reset_hash()

    def _unindex(self, block):
        if self._index.get(block.block_hash) is block:
            del self._index[block.block_hash]

    def _unpend(self, block):
        for blocks, _ in self._pending:
            if block in blocks:
                blocks.remove(block)

    def _adopt(self, key):
        pages = self.client.match_prefix([daemon_key(key)], adopt=True)
        if pages.size == 0:
            return None
        page = int(pages[0])
        block = self.blocks[page]
        if self._state.get(page) in (_OWNED, _SHARED):
            # Held here under no hash of this pool's (evict_blocks dropped
            # it): a miss, as in vLLM; the lookup's reference goes back.
            self.client.free_pages([page])
            return None
        if block.block_hash != key:
            block.reset_hash()  # stale: the page has changed hands
        self._state[page] = _SHARED
        self._untouched[page] = block
        if block.block_hash is None:
            block.block_hash = key
        self._index.setdefault(key, block)
        return block

    def _readopt(self, block):
        if (self._state.get(block.block_id) != _RELEASED or
                block.block_hash is None):
            raise ValueError(
                "touch: block %d is free and not cached; only a block of "
                "get_cached_block or get_new_blocks can be touched" %
                block.block_id)
        pages = self.client.match_prefix([daemon_key(block.block_hash)],
                                         adopt=True)
        if pages.size == 0 or int(pages[0]) != block.block_id:
            if pages.size:
                self.client.free_pages(pages)
            raise ValueError(
                "touch: block %d was evicted from the daemon's cache since "
                "get_cached_block returned it" % block.block_id)
        self._state[block.block_id] = _SHARED
        self._index.setdefault(block.block_hash, block)

    def _drop_shared(self, block):
        self.client.free_pages([block.block_id])
        self._unindex(block)
        self._state[block.block_id] = _RELEASED

    def _give_back_untouched(self):
        untouched = [b for b in self._untouched.values() if b.ref_cnt == 0]
        self._untouched = {}
        if untouched:
            self.client.free_pages([b.block_id for b in untouched])
            for block in untouched:
                self._unindex(block)
                self._state[block.block_id] = _RELEASED


def block_pool_factory(target, **options):
    """A callable with the constructor signature of vLLM's BlockPool
    (num_gpu_blocks, enable_caching, hash_block_size,
    enable_kv_cache_events, metrics_collector, by position or name; other
    options of newer versions are logged and ignored) that makes a BlockPool on
    the daemon at `target`; `options` are BlockPool's keyword options
    (name, reserve_batch, publish_on_cache). vLLM's residency metrics
    collector is not fed: the daemon's /metrics has the pool's figures.
    docs/python.md ("vLLM") shows where vLLM takes it."""

    def make(num_gpu_blocks, enable_caching, hash_block_size=None,
             enable_kv_cache_events=False, metrics_collector=None,
             **others):
        del metrics_collector
        if others:
            logger.warning("pagealloc.vllm.BlockPool does not take vLLM's "
                           "block pool options %s; they are ignored",
                           sorted(others))
        return BlockPool(target, num_gpu_blocks, enable_caching,
                         hash_block_size, enable_kv_cache_events, **options)

    return make
