"""SGLang's radix prefix cache, its full pages shared through the daemon.

``RadixCache`` has the interface of SGLang's ``RadixCache``
(``sglang/srt/mem_cache/radix_cache.py``) as SGLang's scheduler calls it:
``match_prefix``, ``insert``, ``cache_finished_req``,
``cache_unfinished_req``, ``evict``, ``inc_lock_ref`` / ``dec_lock_ref``,
``evictable_size``, ``protected_size``, ``total_size`` and ``reset``, in
SGLang's current call shapes (``MatchPrefixParams``, ``InsertParams``,
``EvictParams``; a ``MatchResult`` back) and its older positional ones
(a token list, ``insert(key, value)``, ``evict(num_tokens)``). It needs one
of ``pagealloc.sglang``'s allocators, whose session it publishes through:

    allocator = pagealloc.sglang.make_allocator(
        "unix:///run/pagealloc/gpu0.sock")
    tree_cache = pagealloc.sglang_radix.RadixCache(
        req_to_token_pool, allocator, page_size)   # or RadixCache(params)

The local tree is SGLang's, node for node: it indexes what this scheduler
holds, each node's value the KV slots of its tokens, its sizes, locks and
LRU eviction of leaves SGLang's. Beyond that:

* Every whole page a node gains by ``insert`` (and so by
  ``cache_finished_req`` / ``cache_unfinished_req``) is published to the
  daemon's prefix index under a chained content key
  (``pagealloc.prefix_keys.page_keys``: parent key, the page's tokens,
  the extra key). A key another session published first keeps that
  session's page; this scheduler's copy stays its own.
* ``match_prefix`` extends the local match from the daemon's index: the
  whole pages of the key beyond the local hit that any session published
  (or left cached) are adopted, a reference each for this session, and
  become one new node of the local tree, so that a prefix another
  scheduler computed is a hit here.
* A page of the tree is either this session's own (freed through the
  allocator, back to its reserve) or shared (published by this session or
  adopted; freed through the daemon, which drops this session's reference
  and keeps the page cached for the others until its LRU evicts it).

Publishing at insert time relies on SGLang's scheduler calling
``cache_*_req`` only once the forward pass that wrote those tokens' KV is
done (it processes a batch's result after the batch's copy to the host
has completed); another session may read a page as soon as it is
published. docs/python.md, "SGLang's radix cache on the daemon", lists
where this class differs from SGLang's.
"""

import dataclasses
import heapq
import itertools
import logging
from typing import Any, NamedTuple

import numpy as np

from pagealloc import prefix_keys
from pagealloc._compat import with_known_fields
from pagealloc.errors import ResourceExhaustedError

try:  # PyTorch is optional: without it slot values are NumPy arrays.
    import torch
except ImportError:  # pragma: no cover - depends on the host
    torch = None

logger = logging.getLogger(__name__)

__all__ = [
    "EvictParams",
    "EvictResult",
    "InsertParams",
    "InsertResult",
    "MatchPrefixParams",
    "MatchResult",
    "RadixCache",
    "RadixKey",
    "TreeNode",
    "register_with_sglang",
]

# SGLang's own parameter and result classes when SGLang is importable, so
# that its scheduler sees its own types; else ones with the fields it reads.
try:
    from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: F401
        EvictParams, EvictResult, InsertParams, InsertResult,
        MatchPrefixParams, MatchResult)
except ImportError:  # pragma: no cover - exercised where SGLang is absent

    @dataclasses.dataclass
    class MatchPrefixParams:
        """SGLang's MatchPrefixParams: the key to look up."""
        key: Any
        cow_mamba: bool = False
        req: Any = None

    @dataclasses.dataclass
    class InsertParams:
        """SGLang's InsertParams: the key, its KV slots, and options this
        cache takes and ignores (chunked, priority)."""
        key: Any = None
        value: Any = None
        chunked: bool = False
        priority: int = 0

    @dataclasses.dataclass
    class InsertResult:
        """SGLang's InsertResult: how much of the key was in the tree."""
        prefix_len: int
        total_len: int = 0
        last_device_node: Any = None

    @dataclasses.dataclass
    class EvictParams:
        """SGLang's EvictParams: the tokens to evict."""
        num_tokens: int = 0
        swa_num_tokens: int = 0
        mamba_num: int = 0

    @dataclasses.dataclass
    class EvictResult:
        """SGLang's EvictResult: the tokens evicted."""
        num_tokens_evicted: int = 0
        swa_num_tokens_evicted: int = 0
        mamba_num_evicted: int = 0

    class MatchResult(NamedTuple):
        """SGLang's MatchResult: the matched slots and the last node (the
        host node is the same one: no host tier)."""
        device_indices: Any
        last_device_node: Any
        last_host_node: Any
        best_match_node: Any = None
        host_hit_length: int = 0

try:
    from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: F401
except ImportError:  # pragma: no cover - exercised where SGLang is absent

    class RadixKey:
        """SGLang's RadixKey: token ids and an extra key (a LoRA id, a
        cache salt) that keeps equal tokens of different extra keys apart.
        Slicing keeps the extra key."""

        def __init__(self, token_ids, extra_key=None, is_bigram=False):
            self.token_ids = token_ids
            self.extra_key = extra_key
            self.is_bigram = is_bigram

        def __len__(self):
            return len(self.token_ids)

        def __iter__(self):
            return iter(self.token_ids)

        def __getitem__(self, idx):
            if isinstance(idx, slice):
                return RadixKey(self.token_ids[idx], self.extra_key)
            return RadixKey([self.token_ids[idx]], self.extra_key)

        def __repr__(self):
            return "RadixKey(extra_key=%r, token_ids=%s%s)" % (
                self.extra_key, self.token_ids[:10],
                "..." if len(self.token_ids) > 10 else "")


def _copy(value):
    """A copy of a slice of a node's value (tensor or NumPy array)."""
    if torch is not None and isinstance(value, torch.Tensor):
        return value.clone()
    return value.copy()


def _as_key(key):
    """`key` as (token id list, extra key): a RadixKey (SGLang's or this
    module's), or a plain sequence of token ids (SGLang's older API)."""
    if hasattr(key, "token_ids"):
        tokens, extra = key.token_ids, getattr(key, "extra_key", None)
        if getattr(key, "is_bigram", False):
            raise NotImplementedError(
                "bigram (EAGLE) keys are not supported by the daemon-backed "
                "RadixCache")
    else:
        tokens, extra = key, None
    if torch is not None and isinstance(tokens, torch.Tensor):
        tokens = tokens.tolist()
    elif isinstance(tokens, np.ndarray):
        tokens = tokens.tolist()
    return list(tokens), extra


class TreeNode:
    """A node of the tree: SGLang's fields (children by child key, parent,
    key, value, lock_ref, last_access_time, hit_count, host_value, id) and
    per page of the key its content key (``page_keys``) and whether this
    session holds it as a daemon reference (``shared``) rather than as a
    page of its own. ``slots`` is a host copy of ``value``."""

    _ids = itertools.count()

    def __init__(self):
        self.children = {}
        self.parent = None
        self.key = None            # RadixKey
        self.value = None          # int64 tensor (or NumPy array) of slots
        self.slots = np.zeros(0, dtype=np.int64)
        self.page_keys = []
        self.shared = np.zeros(0, dtype=bool)
        self.lock_ref = 0
        self.last_access_time = 0
        self.hit_count = 0
        self.host_value = None
        self.priority = 0
        self.id = next(TreeNode._ids)

    @property
    def evicted(self):
        return self.value is None

    @property
    def backuped(self):
        return self.host_value is not None

    def __lt__(self, other):
        return (self.last_access_time, self.id) < (other.last_access_time,
                                                   other.id)

    def __repr__(self):
        return "TreeNode(id=%d, tokens=%d, lock_ref=%d)" % (
            self.id, len(self.slots), self.lock_ref)


class RadixCache:
    """SGLang's RadixCache whose whole pages are shared through a pagealloc
    daemon (see the module's docstring).

    Constructed as SGLang's current class, ``RadixCache(params)`` with a
    ``CacheInitParams`` (``req_to_token_pool``,
    ``token_to_kv_pool_allocator``, ``page_size``, ``disable``,
    ``disable_finished_insert``, ``eviction_policy``), or as its older one,
    ``RadixCache(req_to_token_pool, token_to_kv_pool_allocator, page_size,
    disable=False, enable_kv_cache_events=False)``. The allocator must be
    one of pagealloc.sglang's (its session publishes and adopts) with the
    daemon's page size. ``share=False`` keeps the tree local (SGLang's
    cache on the daemon's allocator, nothing published or adopted).

    Invariants: every non-root node's key has a multiple of page_size
    tokens (SGLang's page alignment), one content key and one shared flag
    per page; a shared page is held by this session as one daemon
    reference, an own page is the allocator's; evictable_size() +
    protected_size() == total_size().

    This class is not thread-safe (SGLang's scheduler calls it from one
    thread).
    """

    def __init__(self, params=None, token_to_kv_pool_allocator=None,
                 page_size=None, disable=False, enable_kv_cache_events=False,
                 *, req_to_token_pool=None, share=True,
                 eviction_policy="lru"):
        disable_finished_insert = False
        is_eagle = False
        if params is not None and hasattr(params,
                                          "token_to_kv_pool_allocator"):
            req_to_token_pool = params.req_to_token_pool
            token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
            page_size = params.page_size
            disable = getattr(params, "disable", False)
            enable_kv_cache_events = getattr(params,
                                             "enable_kv_cache_events", False)
            disable_finished_insert = getattr(params,
                                              "disable_finished_insert", False)
            is_eagle = getattr(params, "is_eagle", False)
            eviction_policy = getattr(params, "eviction_policy", "lru")
        elif params is not None:
            req_to_token_pool = params
        allocator = token_to_kv_pool_allocator
        client = getattr(allocator, "client", None)
        if client is None or not hasattr(allocator, "pages_published"):
            raise TypeError(
                "token_to_kv_pool_allocator must be one of pagealloc.sglang's "
                "allocators (its daemon session publishes the pages), not %s" %
                type(allocator).__name__)
        if page_size is None:
            page_size = allocator.page_size
        if int(page_size) != allocator.page_size:
            raise ValueError("page_size %d differs from the allocator's %d" %
                             (page_size, allocator.page_size))
        if is_eagle:
            raise NotImplementedError(
                "EAGLE's bigram keys are not supported by the daemon-backed "
                "RadixCache")
        if str(eviction_policy).lower() != "lru":
            raise ValueError(
                "eviction_policy %r: the daemon-backed RadixCache evicts "
                "least recently used leaves first ('lru') only" %
                (eviction_policy,))
        if enable_kv_cache_events:
            logger.info("pagealloc.sglang_radix.RadixCache queues no KV "
                        "events of its own; the daemon's KV event stream "
                        "(--kv_events_endpoint) reports the shared cache")
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = allocator
        self.client = client
        self.page_size = int(page_size)
        self.disable = bool(disable)
        self.disable_finished_insert = bool(disable_finished_insert)
        self.enable_kv_cache_events = False
        self.is_eagle = False
        self.eviction_policy = "lru"
        self.share = bool(share)
        self.device = getattr(allocator, "device", "cpu")
        self.kv_event_queue = []
        self._num_pages = client.pool.num_pages
        self._offsets = np.arange(self.page_size, dtype=np.int64)
        # A logical clock: each touch of a node takes the next tick, so
        # that LRU order never depends on the host's timer resolution.
        self._clock = itertools.count(1)
        self.root_node = None
        self.evictable_leaves = set()
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self._new_root()

    # ------------------------------------------------------------ SGLang's

    def reset(self):
        """Clears the tree and releases its pages: its own pages through the
        allocator, its shared pages through the daemon (they stay cached
        for the other sessions). Call it with no request running, as
        SGLang's flush_cache does."""
        own, shared = [], []
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            pages = self._pages_of(node)
            own.append(pages[~node.shared])
            shared.append(pages[node.shared])
        self._new_root()
        self._free_pages(own, shared)

    def match_prefix(self, params=None, **kwargs):
        """The longest cached prefix of the key (a MatchPrefixParams, a
        RadixKey, or token ids), cut to whole pages: SGLang's local match
        (splitting a node where the match ends inside it), then the pages
        beyond it that the daemon's index holds under this key's chain,
        adopted as one new node. Returns a MatchResult (device_indices:
        int64 slots; last_device_node: the deepest node matched)."""
        key = params.key if hasattr(params, "key") else params
        if key is None:
            key = kwargs["key"]
        tokens, extra = _as_key(key)
        if self.disable or not tokens:
            return self._match_result([], self.root_node)
        tokens = tokens[:len(tokens) // self.page_size * self.page_size]
        if not tokens:
            return self._match_result([], self.root_node)
        values, node, matched = self._match_local(tokens, extra)
        if self.share and matched < len(tokens):
            adopted = self._adopt_from_daemon(node, tokens, matched, extra)
            if adopted is not None:
                values.append(adopted.value)
                node = adopted
        return self._match_result(values, node)

    def insert(self, params=None, value=None, **kwargs):
        """Inserts a key (InsertParams, or key and value by position) with
        its KV slots; returns how many of its tokens were in the tree
        already (an InsertResult for InsertParams, else an int). The key is
        cut to whole pages; the new node's pages are published to the
        daemon."""
        as_params = hasattr(params, "key") and not hasattr(params,
                                                           "token_ids")
        if as_params:
            key, value = params.key, params.value
        else:
            key = params if params is not None else kwargs.get("key")
            value = value if value is not None else kwargs.get("value")
        if self.disable:
            return (with_known_fields(InsertResult, prefix_len=0)
                    if as_params else 0)
        if value is None:
            raise ValueError("insert needs the key's KV slots (value): the "
                             "daemon-backed RadixCache indexes pages")
        tokens, extra = _as_key(key)
        slots = self._host_slots(value)
        if slots.size < len(tokens):
            raise ValueError("insert: %d tokens and %d slots" %
                             (len(tokens), slots.size))
        # Whole pages only (SGLang's callers align the key; a partial page
        # has no key of its own and is never shared).
        aligned = len(tokens) // self.page_size * self.page_size
        prefix_len = self._insert(tokens[:aligned], slots[:aligned], extra)
        if as_params:
            return with_known_fields(InsertResult, prefix_len=prefix_len)
        return prefix_len

    def cache_finished_req(self, req, is_insert=True, **kwargs):
        """Caches a finished request: its committed tokens' whole pages go
        into the tree (and to the daemon), the slots the tree had already
        and the partial last page are freed, and its lock is released."""
        if self.disable_finished_insert:
            is_insert = False
        if hasattr(req, "pop_committed_kv_cache"):
            committed = int(req.pop_committed_kv_cache())
        else:  # SGLang's older Req: the last token's KV is never computed
            committed = len(req.origin_input_ids) + len(req.output_ids) - 1
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        if self.disable:
            self._free_request_slots(row[:committed])
            return
        tokens = (list(req.origin_input_ids) +
                  list(req.output_ids))[:committed]
        kv_indices = row[:len(tokens)]
        aligned = len(tokens) // self.page_size * self.page_size
        protected = self._protected_len(req)
        extra = getattr(req, "extra_key", None)
        if is_insert:
            prefix_len = self._insert(tokens[:aligned],
                                      self._host_slots(kv_indices[:aligned]),
                                      extra)
            self._free_request_slots(kv_indices[protected:prefix_len])
        else:
            self._free_request_slots(kv_indices[protected:aligned])
        self._free_request_slots(kv_indices[aligned:])
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(self, req, chunked=False, **kwargs):
        """Caches the filled part of a running request (chunked prefill):
        its whole pages go into the tree (and to the daemon), the
        duplicates the tree had are freed and the request's row points at
        the tree's slots; the lock moves to the new last node, and
        req.prefix_indices, req.cache_protected_len and req.last_node are
        updated as SGLang does."""
        if self.disable:
            return
        tokens = list(req.fill_ids)
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        kv_indices = row[:len(tokens)]
        aligned = len(tokens) // self.page_size * self.page_size
        protected = self._protected_len(req)
        extra = getattr(req, "extra_key", None)
        prefix_len = self._insert(tokens[:aligned],
                                  self._host_slots(kv_indices[:aligned]),
                                  extra)
        self._free_request_slots(kv_indices[protected:prefix_len])
        values, new_last, matched = self._match_local(tokens[:aligned], extra)
        if matched != aligned:
            raise AssertionError("cache_unfinished_req: %d of %d tokens in "
                                 "the tree after insert" % (matched, aligned))
        new_indices = self._concat(values)
        self._write_row(req.req_pool_idx, protected, new_indices[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(new_last)
        req.cache_protected_len = matched
        if matched < len(kv_indices):
            req.prefix_indices = self._concat(
                [new_indices, self._like_value(kv_indices[matched:])])
        else:
            req.prefix_indices = new_indices
        req.last_node = new_last

    def evict(self, params=0):
        """Evicts at least the tokens asked for (an EvictParams or a
        number), least recently used unlocked leaves first, while there
        are any; a parent left childless and unlocked may follow. Own pages
        go back through the allocator, leaf by leaf; shared pages through
        the daemon in one call, ordered so that its LRU evicts them in the
        same order. Returns an EvictResult for EvictParams, else the
        tokens evicted."""
        as_params = hasattr(params, "num_tokens")
        num_tokens = int(params.num_tokens if as_params else params)
        if self.disable:
            return with_known_fields(EvictResult) if as_params else 0
        heap = [(node.last_access_time, node.id, node)
                for node in self.evictable_leaves]
        heapq.heapify(heap)
        evicted = 0
        shared_runs = []
        try:
            while evicted < num_tokens and heap:
                _, _, node = heapq.heappop(heap)
                pages = self._pages_of(node)
                own = pages[~node.shared]
                if own.size:
                    self.token_to_kv_pool_allocator.free_page_ids(own)
                shared_runs.append(pages[node.shared])
                evicted += len(node.slots)
                parent = node.parent
                self._delete_leaf(node)
                if (parent is not self.root_node and not parent.children and
                        parent.lock_ref == 0):
                    heapq.heappush(heap, (parent.last_access_time, parent.id,
                                          parent))
        finally:
            # The daemon enters the pages of one free into its LRU last page
            # first: the first leaf evicted here goes last, so that it is
            # the first the daemon evicts, and a parent's pages go before
            # its child's.
            self._free_pages([], shared_runs[::-1])
        if as_params:
            return with_known_fields(EvictResult, num_tokens_evicted=evicted)
        return evicted

    def inc_lock_ref(self, node):
        """Locks the path from `node` to the root against eviction; returns
        the change of evictable_size()."""
        if self.disable:
            return 0
        self._check_in_tree(node, "inc_lock_ref")
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                size = len(node.slots)
                self.evictable_size_ -= size
                self.protected_size_ += size
                delta -= size
            node.lock_ref += 1
            self.evictable_leaves.discard(node)
            node = node.parent
        return delta

    def dec_lock_ref(self, node, params=None):
        """Releases one lock on the path from `node` to the root; returns
        the change of evictable_size(). ValueError, changing nothing, for a
        node of another tree or a path with a node not locked (a lock
        released more often than taken; SGLang's count would go
        negative)."""
        if self.disable:
            return 0
        self._check_in_tree(node, "dec_lock_ref")
        walk = node
        while walk is not self.root_node:
            if walk.lock_ref <= 0:
                raise ValueError(
                    "dec_lock_ref: node %d has lock_ref %d; a lock is "
                    "released more often than taken (nothing was changed)" %
                    (walk.id, walk.lock_ref))
            walk = walk.parent
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 1:
                size = len(node.slots)
                self.evictable_size_ += size
                self.protected_size_ -= size
                delta += size
            node.lock_ref -= 1
            self._update_leaf_status(node)
            node = node.parent
        return delta

    def evictable_size(self):
        return self.evictable_size_

    def protected_size(self):
        """The tokens of locked nodes."""
        return self.protected_size_

    def total_size(self):
        total = 0
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            total += len(node.slots)
            stack.extend(node.children.values())
        return total

    def all_values_flatten(self):
        values = []
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            values.append(node.value)
            stack.extend(node.children.values())
        return self._concat(values)

    def pretty_print(self):
        stack = [(self.root_node, 0)]
        while stack:
            node, indent = stack.pop()
            print(" " * indent, len(node.slots), node.key.token_ids[:10],
                  "r=%d" % node.lock_ref,
                  "shared=%d/%d" % (int(node.shared.sum()), node.shared.size))
            for child in node.children.values():
                stack.append((child, indent + 2))
        print("#tokens: %d" % self.total_size())

    def take_events(self):
        """No events of this cache's own (see the constructor)."""
        return []

    # Capability and handle methods SGLang's scheduler asks every cache.
    def is_chunk_cache(self):
        return False

    def supports_fast_match_prefix(self):
        return False

    def root_node_handle(self, extra_key=None):
        return self.root_node

    def resolve_node_handle(self, node_handle):
        return node_handle

    def is_root(self, node):
        return node is self.root_node

    def is_backuped(self, node):
        return node.backuped

    def evict_for_alloc(self, params):
        return self.evict(params)

    def full_evictable_size(self):
        return self.evictable_size_

    def full_protected_size(self):
        return self.protected_size_

    def swa_evictable_size(self):
        return 0

    def swa_protected_size(self):
        return 0

    def sanity_check(self):
        """Checks the sizes against the tree (SGLang's scheduler calls it
        when idle); raises AssertionError when they disagree."""
        evictable = protected = 0
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.lock_ref > 0:
                protected += len(node.slots)
            else:
                evictable += len(node.slots)
        if (evictable, protected) != (self.evictable_size_,
                                      self.protected_size_):
            raise AssertionError(
                "tree has %d evictable and %d protected tokens; the counts "
                "say %d and %d" % (evictable, protected, self.evictable_size_,
                                   self.protected_size_))

    # ----------------------------------------------------- beyond SGLang's

    def shared_pages(self):
        """The pages of the tree held as daemon references, sorted."""
        out = [self._pages_of(n)[n.shared] for n in self._nodes()]
        return np.sort(np.concatenate(out)) if out else np.zeros(
            0, dtype=np.int64)

    def own_pages(self):
        """The tree's pages that are this session's own, sorted."""
        out = [self._pages_of(n)[~n.shared] for n in self._nodes()]
        return np.sort(np.concatenate(out)) if out else np.zeros(
            0, dtype=np.int64)

    # ------------------------------------------------------------ the tree

    def _new_root(self):
        root = TreeNode()
        root.key = RadixKey([], None)
        root.value = self._value([])
        root.lock_ref = 1
        self.root_node = root
        self.evictable_leaves = set()
        self.evictable_size_ = 0
        self.protected_size_ = 0

    def _nodes(self):
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    def _tick(self):
        return next(self._clock)

    def _child_key(self, tokens, extra):
        plain = (tokens[0] if self.page_size == 1 else
                 tuple(tokens[:self.page_size]))
        return plain if extra is None else (extra, plain)

    def _match_len(self, a, b):
        """The tokens of a and b that agree, in whole pages."""
        ps = self.page_size
        n = min(len(a), len(b))
        i = 0
        if ps == 1:
            while i < n and a[i] == b[i]:
                i += 1
            return i
        while i < n and a[i:i + ps] == b[i:i + ps]:
            i += ps
        return i

    def _match_local(self, tokens, extra):
        """SGLang's match: (the matched nodes' values, the last node, the
        tokens matched), splitting the node the match ends inside."""
        values = []
        node = self.root_node
        matched = 0
        while matched < len(tokens):
            child = node.children.get(self._child_key(tokens[matched:],
                                                      extra))
            if child is None:
                break
            child.last_access_time = self._tick()
            n = self._match_len(child.key.token_ids, tokens[matched:])
            if n < len(child.slots):
                node = self._split(child, n, extra)
                values.append(node.value)
                matched += n
                break
            values.append(child.value)
            node = child
            matched += n
        return values, node, matched

    def _split(self, child, split_len, extra):
        """Splits `child` after split_len tokens (whole pages): the new node
        takes the first part and child's place; returns it."""
        pages = split_len // self.page_size
        upper = TreeNode()
        upper.last_access_time = self._tick()
        upper.parent = child.parent
        upper.lock_ref = child.lock_ref
        upper.priority = child.priority
        upper.key = RadixKey(child.key.token_ids[:split_len], extra)
        upper.slots = child.slots[:split_len].copy()
        upper.value = _copy(child.value[:split_len])
        upper.page_keys = child.page_keys[:pages]
        upper.shared = child.shared[:pages].copy()
        child.key = RadixKey(child.key.token_ids[split_len:], extra)
        child.slots = child.slots[split_len:].copy()
        child.value = _copy(child.value[split_len:])
        child.page_keys = child.page_keys[pages:]
        child.shared = child.shared[pages:].copy()
        child.parent = upper
        upper.children = {self._child_key(child.key.token_ids, extra): child}
        upper.parent.children[self._child_key(upper.key.token_ids,
                                              extra)] = upper
        return upper

    def _insert(self, tokens, slots, extra):
        """SGLang's insert of whole pages (tokens page-aligned): walks and
        splits the matching path, adds the rest as one new leaf, publishes
        its whole pages; returns the tokens that were in the tree."""
        node = self.root_node
        matched = 0
        while matched < len(tokens):
            child = node.children.get(self._child_key(tokens[matched:],
                                                      extra))
            if child is None:
                break
            child.last_access_time = self._tick()
            n = self._match_len(child.key.token_ids, tokens[matched:])
            matched += n
            if n < len(child.slots):
                node = self._split(child, n, extra)
            else:
                node = child
        if matched < len(tokens):
            leaf = self._add_leaf(node, tokens[matched:],
                                  slots[matched:], extra)
            if self.share:
                self._publish(leaf)
        return matched

    def _add_leaf(self, parent, tokens, slots, extra, page_keys=None,
                  shared=False):
        """A new leaf under `parent` with these tokens and slots, its page
        keys (computed from the parent's last key when not given)."""
        leaf = TreeNode()
        leaf.last_access_time = self._tick()
        leaf.parent = parent
        leaf.key = RadixKey(list(tokens), extra)
        leaf.slots = np.array(slots, dtype=np.int64)
        leaf.value = self._value(leaf.slots)
        num_pages = len(tokens) // self.page_size
        if page_keys is None:
            page_keys = prefix_keys.page_keys(
                tokens, self.page_size, parent_key=self._last_key(parent),
                extra_key=extra)
        leaf.page_keys = list(page_keys)
        leaf.shared = np.full(num_pages, bool(shared))
        parent.children[self._child_key(leaf.key.token_ids, extra)] = leaf
        self.evictable_size_ += len(tokens)
        self.evictable_leaves.discard(parent)
        self._update_leaf_status(leaf)
        return leaf

    def _last_key(self, node):
        return node.page_keys[-1] if node.page_keys else None

    def _delete_leaf(self, node):
        parent = node.parent
        del parent.children[self._child_key(node.key.token_ids,
                                            node.key.extra_key)]
        self.evictable_size_ -= len(node.slots)
        self.evictable_leaves.discard(node)
        node.value = None
        self._update_leaf_status(parent)

    def _update_leaf_status(self, node):
        if (node is not self.root_node and node.lock_ref == 0 and
                not node.children and node.value is not None):
            self.evictable_leaves.add(node)
        else:
            self.evictable_leaves.discard(node)

    def _check_in_tree(self, node, what):
        walk = node
        while walk is not None and walk is not self.root_node:
            if walk.value is None:  # evicted
                walk = None
                break
            walk = walk.parent
        if walk is None:
            raise ValueError("%s: %r is not a node of this tree (reset since, "
                             "or another cache's); nothing was changed" %
                             (what, node))

    # ------------------------------------------------------------ the daemon

    def _pages_of(self, node):
        """The page ids of a node's slots, one per page."""
        if self.page_size == 1:
            return node.slots.copy()
        return node.slots[::self.page_size] // self.page_size

    def _publish(self, leaf):
        """Publishes the leaf's whole pages (those whose slots are one page,
        in order) under its keys; the pages published become shared, the
        allocator told. A key already in the daemon's index keeps that page
        and the leaf's page stays its own."""
        ps = self.page_size
        pages = self._pages_of(leaf)
        if ps == 1:
            whole = np.ones(pages.size, dtype=bool)
        else:
            blocks = leaf.slots.reshape(-1, ps)
            whole = (blocks == (pages * ps)[:, None] + self._offsets).all(1)
        whole &= (pages >= 1) & (pages <= self._num_pages)
        start = 0
        while start < pages.size:
            if not whole[start]:
                start += 1
                continue
            end = start
            while end < pages.size and whole[end]:
                end += 1
            parent_key = (leaf.page_keys[start - 1] if start else
                          self._last_key(leaf.parent))
            _, existing = self.client.publish(
                pages[start:end], leaf.page_keys[start:end],
                parent_key=parent_key)
            fresh = ~np.asarray(existing, dtype=bool)
            leaf.shared[start:end] = fresh
            if fresh.any():
                self.token_to_kv_pool_allocator.pages_published(
                    pages[start:end][fresh])
            start = end

    def _adopt_from_daemon(self, node, tokens, matched, extra):
        """The pages beyond the local match that the daemon's index holds
        under this chain, adopted (a reference each, taken atomically with
        the match) as a new leaf under `node`; None on a miss."""
        rest = tokens[matched:]
        room = self._num_pages
        keys = prefix_keys.page_keys(rest, self.page_size,
                                     parent_key=self._last_key(node),
                                     extra_key=extra, max_pages=room)
        if not keys:
            return None
        try:
            pages = self.client.match_prefix(keys, adopt=True)
        except ResourceExhaustedError:
            # The adoption would put the session over its quota: refused
            # whole, a miss here (the local match stands).
            return None
        if pages.size == 0:
            return None
        n = int(pages.size)
        slots = (pages[:, None] * self.page_size + self._offsets).reshape(-1)
        return self._add_leaf(node, rest[:n * self.page_size], slots, extra,
                              page_keys=keys[:n], shared=True)

    def _free_pages(self, own_runs, shared_runs):
        """Frees own pages through the allocator and shared ones through the
        daemon (one call each, in the order given)."""
        own = [r for r in own_runs if r.size]
        if own:
            self.token_to_kv_pool_allocator.free_page_ids(np.concatenate(own))
        shared = [r for r in shared_runs if r.size]
        if shared:
            self.client.free_pages(np.concatenate(shared))

    def _free_request_slots(self, slots):
        """Frees a request's own slots through the allocator: the distinct
        pages they lie in, in order (a partial last page whole, as SGLang's
        free of an unaligned tail frees its page)."""
        host = self._host_slots(slots)
        if host.size == 0:
            return
        if self.page_size == 1:
            pages = host
        else:
            pages = host // self.page_size
            _, first = np.unique(pages, return_index=True)
            pages = pages[np.sort(first)]
        self.token_to_kv_pool_allocator.free_page_ids(pages)

    # ------------------------------------------------------------ values

    def _protected_len(self, req):
        protected = getattr(req, "cache_protected_len", None)
        if protected is None:
            protected = len(req.prefix_indices)
        return int(protected)

    def _host_slots(self, values):
        if torch is not None and isinstance(values, torch.Tensor):
            return values.detach().to("cpu", torch.int64).numpy().reshape(-1)
        return np.asarray(values, dtype=np.int64).reshape(-1)

    def _value(self, slots):
        """Host slots as a node's value: an int64 tensor on the allocator's
        device (or a NumPy array without PyTorch)."""
        array = np.array(slots, dtype=np.int64).reshape(-1)
        if torch is None:
            return array
        return torch.from_numpy(array).to(self.device)

    def _like_value(self, values):
        if torch is not None and not isinstance(values, torch.Tensor):
            return torch.as_tensor(np.asarray(values, dtype=np.int64),
                                   device=self.device)
        return values

    def _concat(self, values):
        if not values:
            return self._value([])
        if torch is not None:
            return torch.cat([self._like_value(v).to(torch.int64)
                              for v in values])
        return np.concatenate(values)

    def _match_result(self, values, node):
        indices = self._concat(values)
        return with_known_fields(MatchResult, device_indices=indices,
                                 last_device_node=node, last_host_node=node,
                                 best_match_node=node)

    def _write_row(self, req_pool_idx, start, values):
        pool = self.req_to_token_pool
        end = start + len(values)
        if hasattr(pool, "write"):
            pool.write((req_pool_idx, slice(start, end)), values)
        else:
            pool.req_to_token[req_pool_idx, start:end] = values


def register_with_sglang():
    """Registers RadixCache as a virtual subclass of SGLang's
    BasePrefixCache (an abc), so that SGLang's isinstance checks accept it.
    Returns False when SGLang is not importable."""
    try:
        from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
    except ImportError:
        return False
    BasePrefixCache.register(RadixCache)
    return True

