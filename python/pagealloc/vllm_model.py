"""A plain-Python re-statement of vLLM v1's block pool.

This is the project's own statement, written from reading vLLM's
``vllm/v1/core/block_pool.py`` and ``vllm/v1/core/kv_cache_utils.py``
(``BlockPool``, ``FreeKVCacheBlockQueue``, ``KVCacheBlock``): the reference
that ``pagealloc.vllm.BlockPool`` is compared with, block for block, in
python/tests/test_vllm.py. It allocates nothing and needs nothing but the
standard library.

What it states, as vLLM does it:

* Blocks ``0 .. num_gpu_blocks - 1``; block 0 is the null block, taken out
  of the free queue at the start, never freed, never counted as free.
* The free queue starts as ``1 .. num_gpu_blocks - 1``. ``get_new_blocks(n)``
  pops ``n`` from its front (ValueError, taking nothing, when fewer are
  free); a popped block that still has a hash is evicted from the cache
  first (a ``removed`` event). Each new block has ``ref_cnt`` 1.
* ``free_blocks(ordered)`` drops one reference per block given; the blocks
  whose count reaches 0 are appended to the back of the queue in the order
  given (the first given is evicted first). A freed block keeps its hash and
  can still be hit until it reaches the front.
* ``touch(blocks)`` takes one reference per block, removing a block of
  count 0 from the queue (a cache hit on a free block).
* ``cache_full_blocks`` gives blocks ``[num_cached, num_full)`` of a request
  the request's block hashes (with the KV cache group id) and indexes them;
  duplicates are kept (the first indexed is the one a lookup returns), and
  one ``stored`` event names the new blocks' hashes, the parent's hash, the
  tokens, the block size and the LoRA id. Null blocks are skipped.
* ``get_cached_block(hash, group_ids)`` returns one block per group, or None
  when any group misses; it takes no reference.
* ``evict_blocks(ids)`` drops the given blocks from the index (their counts
  and queue places unchanged), a ``removed`` event for each that had a hash.
* ``reset_prefix_cache()`` is False while any block but the null block is
  in use; else it clears every hash and the index (a ``cleared`` event).
* ``get_num_free_blocks()`` is the queue's length; ``get_usage()`` is
  ``1 - free / (num_gpu_blocks - 1)``.

Events are tuples: ``("stored", hashes, parent_hash, token_ids, block_size,
lora_id)``, ``("removed", hashes)``, ``("cleared",)``; hashes are the block
hashes as given (bytes), without the group id.
"""

import collections


def hash_with_group(block_hash, group_id):
    """vLLM's BlockHashWithGroupId: the hash's bytes, then the group id as
    4 big-endian bytes."""
    return bytes(block_hash) + int(group_id).to_bytes(4, "big")


class Block:
    """A block's state: its id, reference count and hash (with group)."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "is_null")

    def __init__(self, block_id):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash = None
        self.is_null = False


class BlockPoolModel:
    """vLLM's BlockPool, stated over block ids."""

    def __init__(self, num_gpu_blocks, enable_caching=True,
                 enable_kv_cache_events=True):
        assert num_gpu_blocks > 0
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.blocks = [Block(i) for i in range(num_gpu_blocks)]
        # The free queue in eviction order (an ordered dict: O(1) removal).
        self.free_queue = collections.OrderedDict(
            (i, None) for i in range(num_gpu_blocks))
        self.free_queue.popitem(last=False)
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        # hash with group -> {block id: block}, in insertion order.
        self.cache = {}
        self.events = []

    def _evict(self, block):
        key = block.block_hash
        if key is None:
            return False
        holders = self.cache.get(key)
        if holders is None or block.block_id not in holders:
            return False
        del holders[block.block_id]
        if not holders:
            del self.cache[key]
        block.block_hash = None
        if self.enable_kv_cache_events:
            self.events.append(("removed", [key[:-4]]))
        return True

    def get_cached_block(self, block_hash, group_ids):
        found = []
        for group_id in group_ids:
            holders = self.cache.get(hash_with_group(block_hash, group_id))
            if not holders:
                return None
            found.append(next(iter(holders.values())))
        return found

    def get_new_blocks(self, num_blocks):
        if num_blocks > self.get_num_free_blocks():
            raise ValueError("Cannot get %d free blocks from the pool" %
                             num_blocks)
        taken = []
        for _ in range(num_blocks):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            if self.enable_caching:
                self._evict(block)
            assert block.ref_cnt == 0
            block.ref_cnt = 1
            taken.append(block)
        return taken

    def touch(self, blocks):
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks):
        blocks = list(ordered_blocks)
        for block in blocks:
            block.ref_cnt -= 1
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_queue[block.block_id] = None

    def cache_full_blocks(self, block_hashes, token_ids, lora_id, blocks,
                          num_cached_blocks, num_full_blocks, block_size,
                          group_id):
        """vLLM's cache_full_blocks with the request's fields spelt out:
        its block hashes, all its token ids and its LoRA id."""
        if num_cached_blocks >= num_full_blocks:
            return
        assert len(block_hashes) >= num_full_blocks
        new_hashes = []
        for i, block in enumerate(blocks[num_cached_blocks:num_full_blocks]):
            if block.is_null:
                continue
            assert block.block_hash is None
            block_hash = block_hashes[num_cached_blocks + i]
            key = hash_with_group(block_hash, group_id)
            block.block_hash = key
            self.cache.setdefault(key, {})[block.block_id] = block
            new_hashes.append(bytes(block_hash))
        if self.enable_kv_cache_events:
            parent = (bytes(block_hashes[num_cached_blocks - 1])
                      if num_cached_blocks else None)
            self.events.append(
                ("stored", new_hashes, parent,
                 list(token_ids[num_cached_blocks * block_size:
                                num_full_blocks * block_size]),
                 block_size, lora_id))

    def evict_blocks(self, block_ids):
        for block_id in block_ids:
            assert block_id < len(self.blocks)
            self._evict(self.blocks[block_id])

    def reset_prefix_cache(self):
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:
            return False
        self.cache = {}
        for block in self.blocks:
            block.block_hash = None
        if self.enable_kv_cache_events:
            self.events.append(("cleared",))
        return True

    def get_num_free_blocks(self):
        return len(self.free_queue)

    def get_usage(self):
        total = self.num_gpu_blocks - 1
        if not total:
            return 0
        return 1.0 - self.get_num_free_blocks() / total

    def take_events(self):
        if not self.enable_kv_cache_events:
            return []
        events, self.events = self.events, []
        return events
