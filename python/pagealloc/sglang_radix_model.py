"""A pure-Python statement of SGLang's RadixCache, and of one session's view
of the daemon's prefix index, to test pagealloc.sglang_radix against.

SGLang's RadixCache (``sglang/srt/mem_cache/radix_cache.py``), restated in
our own words and code:

* The tree maps token sequences (cut to whole pages) to KV slots. A node's
  children are keyed by their first page of tokens (with the extra key, when
  there is one, so that equal tokens of different extra keys never share a
  node). The root holds nothing and is always locked.
* ``match(tokens)`` walks from the root while a child's tokens agree with
  the rest of the key, page by page, touching each node it visits; where
  the agreement ends inside a node, that node is split at the last page
  that agrees, and the upper part (a new node) ends the match. It returns
  the slots of the matched nodes and the last node.
* ``insert(tokens, slots)`` walks and splits the same way, then hangs what
  is left as one new leaf (evictable), and returns how many tokens were in
  the tree already.
* ``evict(n)`` removes unlocked leaves, least recently touched first, until
  at least n tokens are gone or none is left; a parent that becomes an
  unlocked leaf joins the candidates. Each removed leaf's slots are freed.
* ``inc_lock(node)`` / ``dec_lock(node)`` add or remove one lock on every
  node from ``node`` up to the root; a node's tokens count as protected
  while it holds a lock and as evictable otherwise.
* A finished request puts its committed tokens' whole pages into the tree,
  frees the slots between what it had matched and what the tree already
  held (duplicates), frees the partial last page, and drops its lock. An
  unfinished one (chunked prefill) does the same insert, then points its
  row at the tree's slots and moves its lock to the new last node.

SGLang touches nodes with ``time.monotonic()``; this statement uses a
logical clock that ticks once per node touched or created, in the order
SGLang touches them, so that least recently used is never a tie.

The daemon side (``ModelPool``): the pages of one session, each its own or
held by one reference (shared), and the cache of shared pages no session
holds, by content. Publishing a page makes it shared unless its content is
in the index already (then the page stays the session's own); matching
adopts the longest run of indexed content beyond a point; freeing a shared
page leaves it cached. The daemon never evicts here (tests size the pool so
that it needs not); ``reset_cache`` is the operator's reset. A page's
content key is (extra key, every token up to the page's end), the
statement of a chained hash.
"""

import itertools

__all__ = ["ModelPool", "ModelRadixCache", "ModelNode"]


class ModelPool:
    """One session's pages on the daemon: own, shared (one reference) and
    the cache of unheld shared pages."""

    def __init__(self):
        self.own = set()
        self.shared = {}   # page -> content key
        self.index = {}    # content key -> page (shared or cached)
        self.cached = {}   # content key -> page, held by nobody

    def alloc(self, pages):
        for page in pages:
            assert page not in self.own and page not in self.shared, page
            self.own.add(page)

    def publish(self, pages, keys):
        """Whether each page became shared (its key was not indexed)."""
        fresh = []
        for page, key in zip(pages, keys):
            if key in self.index:
                fresh.append(False)
                continue
            self.own.remove(page)
            self.shared[page] = key
            self.index[key] = page
            fresh.append(True)
        return fresh

    def match_adopt(self, keys):
        pages = []
        for key in keys:
            page = self.index.get(key)
            if page is None:
                break
            assert page not in self.shared, "adopting a page held already"
            del self.cached[key]
            self.shared[page] = key
            pages.append(page)
        return pages

    def free(self, pages):
        for page in pages:
            if page in self.own:
                self.own.remove(page)
            else:
                key = self.shared.pop(page)
                self.cached[key] = page

    def reset_cache(self):
        for key in self.cached:
            del self.index[key]
        count = len(self.cached)
        self.cached = {}
        return count


class ModelNode:
    def __init__(self, parent, tokens, slots, shared, time):
        self.parent = parent
        self.tokens = list(tokens)
        self.slots = list(slots)
        self.shared = list(shared)   # one flag per page
        self.children = {}
        self.lock = 0
        self.time = time


class ModelRadixCache:
    """SGLang's RadixCache over ModelPool (see the module's docstring).
    `share`: publish new pages and extend matches from the pool's index."""

    def __init__(self, page_size, pool, share=True):
        self.ps = page_size
        self.pool = pool
        self.share = share
        self.clock = itertools.count(1)
        self.reset_tree()

    def reset_tree(self):
        self.root = ModelNode(None, [], [], [], 0)
        self.root.lock = 1
        self.evictable = 0
        self.protected = 0

    def reset(self):
        """Drops the tree and frees every page of it."""
        pages = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            pages += self._pages(node.slots)
        self.reset_tree()
        self.pool.free(pages)

    # ---- keys and pages

    def _first(self, tokens, extra):
        first = tokens[0] if self.ps == 1 else tuple(tokens[:self.ps])
        return first if extra is None else (extra, first)

    def _agree(self, a, b):
        n = 0
        while (n < min(len(a), len(b)) and
               a[n:n + self.ps] == b[n:n + self.ps]):
            n += self.ps
        return min(n, len(a), len(b))

    def _pages(self, slots):
        return [slots[i] // self.ps for i in range(0, len(slots), self.ps)]

    def _content(self, tokens, end, extra):
        return (extra, tuple(tokens[:end]))

    # ---- the tree

    def _split(self, node, n):
        upper = ModelNode(node.parent, node.tokens[:n], node.slots[:n],
                          node.shared[:n // self.ps], next(self.clock))
        upper.lock = node.lock
        extra_of = self._extra_of(node)
        node.parent.children[self._first(upper.tokens, extra_of)] = upper
        node.tokens, node.slots = node.tokens[n:], node.slots[n:]
        node.shared = node.shared[n // self.ps:]
        node.parent = upper
        upper.children = {self._first(node.tokens, extra_of): node}
        upper.extra = extra_of
        return upper

    def _extra_of(self, node):
        return getattr(node, "extra", None)

    def _walk(self, tokens, extra):
        values, node, done = [], self.root, 0
        while done < len(tokens):
            child = node.children.get(self._first(tokens[done:], extra))
            if child is None:
                break
            child.time = next(self.clock)
            n = self._agree(child.tokens, tokens[done:])
            done += n
            if n < len(child.tokens):
                node = self._split(child, n)
                values += node.slots
                break
            values += child.slots
            node = child
        return values, node, done

    def _leaf(self, parent, tokens, slots, shared, extra):
        leaf = ModelNode(parent, tokens, slots, shared, next(self.clock))
        leaf.extra = extra
        parent.children[self._first(tokens, extra)] = leaf
        self.evictable += len(tokens)
        return leaf

    def match(self, tokens, extra=None):
        """(slots, last node) of the longest cached prefix."""
        tokens = list(tokens)[:len(tokens) // self.ps * self.ps]
        if not tokens:
            return [], self.root
        values, node, done = self._walk(tokens, extra)
        if self.share and done < len(tokens):
            keys = [self._content(tokens, end, extra)
                    for end in range(done + self.ps, len(tokens) + 1,
                                     self.ps)]
            pages = self.pool.match_adopt(keys)
            if pages:
                n = len(pages) * self.ps
                slots = [p * self.ps + o for p in pages
                         for o in range(self.ps)]
                node = self._leaf(node, tokens[done:done + n], slots,
                                  [True] * len(pages), extra)
                values += slots
        return values, node

    def insert(self, tokens, slots, extra=None):
        tokens = list(tokens)
        slots = list(slots)[:len(tokens)]
        _, node, done = self._walk(tokens, extra)
        if done < len(tokens):
            new_slots = slots[done:]
            pages = self._pages(new_slots)
            shared = [False] * len(pages)
            if self.share:
                whole = [new_slots[i * self.ps:(i + 1) * self.ps] ==
                         [p * self.ps + o for o in range(self.ps)]
                         for i, p in enumerate(pages)]
                keys = [self._content(tokens, done + (i + 1) * self.ps,
                                      extra) for i in range(len(pages))]
                run = [i for i in range(len(pages)) if whole[i]]
                fresh = self.pool.publish([pages[i] for i in run],
                                          [keys[i] for i in run])
                for i, f in zip(run, fresh):
                    shared[i] = f
            self._leaf(node, tokens[done:], new_slots, shared, extra)
        return done

    def _leaves(self):
        out = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.lock == 0:
                out.append(node)
        return out

    def evict(self, num_tokens):
        candidates = self._leaves()
        evicted = 0
        while evicted < num_tokens and candidates:
            node = min(candidates, key=lambda n: n.time)
            candidates.remove(node)
            self.pool.free(self._pages(node.slots))
            evicted += len(node.tokens)
            parent = node.parent
            del parent.children[self._first(node.tokens,
                                            self._extra_of(node))]
            self.evictable -= len(node.tokens)
            if (parent is not self.root and not parent.children and
                    parent.lock == 0):
                candidates.append(parent)
        return evicted

    def inc_lock(self, node):
        while node is not self.root:
            if node.lock == 0:
                self.evictable -= len(node.tokens)
                self.protected += len(node.tokens)
            node.lock += 1
            node = node.parent

    def dec_lock(self, node):
        while node is not self.root:
            assert node.lock > 0
            if node.lock == 1:
                self.evictable += len(node.tokens)
                self.protected -= len(node.tokens)
            node.lock -= 1
            node = node.parent

    def total(self):
        total = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            total += len(node.tokens)
            stack.extend(node.children.values())
        return total

    def dump(self):
        """Every node as (extra key, tokens from the root, slots, shared
        flags, lock count), sorted."""
        out = []
        stack = [(c, []) for c in self.root.children.values()]
        while stack:
            node, above = stack.pop()
            path = above + node.tokens
            out.append((repr(self._extra_of(node)), tuple(path),
                        tuple(node.slots), tuple(node.shared), node.lock))
            stack.extend((c, path) for c in node.children.values())
        return sorted(out)

    # ---- requests (the scheduler's side, as SGLang's cache does it)

    def _free_slots(self, slots):
        pages = []
        for slot in slots:
            if slot // self.ps not in pages:
                pages.append(slot // self.ps)
        self.pool.free(pages)

    def cache_finished(self, req, row, insert=True):
        """`req`: origin_input_ids, output_ids, committed (tokens whose KV
        is written), cache_protected_len, last_node, extra_key; `row` the
        request's slots."""
        tokens = (list(req.origin_input_ids) +
                  list(req.output_ids))[:req.committed]
        kv = row[:len(tokens)]
        aligned = len(tokens) // self.ps * self.ps
        if insert:
            done = self.insert(tokens[:aligned], kv[:aligned], req.extra_key)
            self._free_slots(kv[req.cache_protected_len:done])
        else:
            self._free_slots(kv[req.cache_protected_len:aligned])
        self._free_slots(kv[aligned:])
        self.dec_lock(req.last_node)

    def cache_unfinished(self, req, row):
        """Returns the row with the tree's slots in it; updates req's
        prefix_indices, cache_protected_len and last_node."""
        tokens = list(req.fill_ids)
        kv = row[:len(tokens)]
        aligned = len(tokens) // self.ps * self.ps
        done = self.insert(tokens[:aligned], kv[:aligned], req.extra_key)
        self._free_slots(kv[req.cache_protected_len:done])
        values, node, matched = self._walk(tokens[:aligned], req.extra_key)
        assert matched == aligned
        row = list(row)
        row[req.cache_protected_len:matched] = values[
            req.cache_protected_len:]
        self.dec_lock(req.last_node)
        self.inc_lock(node)
        req.cache_protected_len = matched
        req.prefix_indices = values + list(kv[matched:])
        req.last_node = node
        return row
