"""Content keys of KV pages for the daemon's shared prefix index.

The daemon keys each shared page by 32 opaque bytes that the client
computes (docs/design.md section 13); it never hashes tokens. A client that
has no block hash of its own (SGLang's radix cache,
``pagealloc.sglang_radix``) keys its pages with ``page_keys``: page i's key
is the SHA-256 of

    a domain tag | the parent's key | the extra key's tag | the page's tokens

where the parent's key is page i - 1's (32 zero bytes at a chain's start),
the extra key (SGLang's ``RadixKey.extra_key``: a LoRA id, a cache salt)
is tagged with its type and length so that no two extra keys hash alike,
and the tokens are little-endian int64. A key thus names the whole prefix
up to its page's end, as a vLLM block hash does: two sessions that computed
the same prefix under the same extra key find each other's pages.

``pagealloc.vllm`` keys pages by vLLM's own block hashes instead
(``daemon_key``): vLLM computes them already, and its KV events carry them.
Pages keyed one way are never found the other way; engines that share a
pool share a KV layout, so they are one engine's schedulers anyway.
"""

import hashlib

import numpy as np

from pagealloc.client import PREFIX_KEY_BYTES

__all__ = ["extra_key_tag", "page_keys"]

_DOMAIN = b"pagealloc.page_key.v1"
_NO_PARENT = bytes(PREFIX_KEY_BYTES)


def extra_key_tag(extra_key):
    """The bytes an extra key contributes to every page's key: one type
    byte, a 4-byte length and the value (None, str, bytes or int)."""
    if extra_key is None:
        return b"\x00"
    if isinstance(extra_key, str):
        kind, raw = b"\x01", extra_key.encode("utf-8")
    elif isinstance(extra_key, (bytes, bytearray)):
        kind, raw = b"\x02", bytes(extra_key)
    elif isinstance(extra_key, (int, np.integer)):
        kind, raw = b"\x03", str(int(extra_key)).encode()
    else:
        raise TypeError("extra_key is a %s; str, bytes, int or None expected"
                        % type(extra_key).__name__)
    return kind + len(raw).to_bytes(4, "little") + raw


def page_keys(token_ids, page_size, *, parent_key=None, extra_key=None,
              max_pages=None):
    """The keys of the whole pages of `token_ids` (a partial last page has
    none), in chain order: the first page's parent is `parent_key` (None at
    a chain's start). `max_pages` bounds how many are computed."""
    page_size = int(page_size)
    if page_size < 1:
        raise ValueError("page_size %d is not positive" % page_size)
    tokens = np.ascontiguousarray(np.asarray(token_ids, dtype="<i8")
                                  .reshape(-1))
    num_pages = tokens.size // page_size
    if max_pages is not None:
        num_pages = min(num_pages, int(max_pages))
    raw = tokens[:num_pages * page_size].tobytes()
    step = page_size * 8
    tag = extra_key_tag(extra_key)
    parent = _NO_PARENT if parent_key is None else bytes(parent_key)
    if len(parent) != PREFIX_KEY_BYTES:
        raise ValueError("parent_key is %d bytes; a key is %d" %
                         (len(parent), PREFIX_KEY_BYTES))
    keys = []
    for i in range(num_pages):
        parent = hashlib.sha256(_DOMAIN + parent + tag +
                                raw[i * step:(i + 1) * step]).digest()
        keys.append(parent)
    return keys
