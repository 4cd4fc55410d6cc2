"""Shared prefix pages through the Python package against a real daemon:
a writer fills pages in the KV slab and publishes them, a sibling matches
and adopts them after the writer is gone and reads the writer's bytes,
freed pages stay cached until reset; bad keys are refused by index."""

import hashlib
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import pagealloc
from conftest import BACKEND, wait_until

pytestmark = pytest.mark.skipif(
    BACKEND == "cuda", reason="reads the slab from the host (CPU backend)")

LAYOUT = "mha:layers=1,kv_heads=1,head_dim=4,dtype=fp16"


def chain(prompt, pages):
    """vLLM-style chained keys: each page's key hashes its parent's."""
    keys, parent = [], b""
    for page in range(pages):
        parent = hashlib.sha256(
            parent + ("%s/%d" % (prompt, page)).encode()).digest()
        keys.append(parent)
    return keys


@pytest.fixture
def prefix_daemon(make_daemon):
    return make_daemon("--num_pages=16", "--page_size=4",
                       "--kv_layout=" + LAYOUT, "--prefix_max_pinned_pages=2")


def test_a_sibling_adopts_published_pages_and_reads_the_writers_kv(
        prefix_daemon):
    keys = chain("system prompt", 3)
    with prefix_daemon.connect(name="sibling") as sibling:
        with prefix_daemon.connect(name="writer") as writer:
            slots = np.asarray(writer.alloc([12], return_inline=True)
                               .check().slots)
            k = np.asarray(writer.kv_buffer("k.0"))
            k[slots] = np.arange(slots.size * 4, dtype=np.float16).reshape(
                slots.size, 1, 4)
            pages = slots[::4] // 4
            published, existing = writer.publish(pages, keys)
            assert published.tolist() == pages.tolist()
            assert not existing.any()
        # The writer is gone; its published pages stay cached.
        assert sibling.stats().used_pages == 0
        found = sibling.match_prefix(keys + chain("other", 1), adopt=True)
        assert found.tolist() == pages.tolist()
        theirs = np.asarray(sibling.kv_buffer("k.0"))
        assert theirs[slots].ravel().tolist() == list(range(slots.size * 4))
        assert sibling.free_pages(found) == 3
    assert pagealloc.reset_prefix_cache(prefix_daemon.target) == 3


# A scheduler process: writes a pattern into 3 pages of the slab and 2
# more, publishes the 3 under the chain's keys, says which pages, then
# waits to be killed.
WRITER = r"""
import sys
import numpy as np
import pagealloc
sys.path.insert(0, sys.argv[2])
from test_prefix import chain
with pagealloc.Client.connect(sys.argv[1], name="writer") as writer:
    slots = np.asarray(writer.alloc([20], return_inline=True).check().slots)
    k = np.asarray(writer.kv_buffer("k.0"))
    k[slots] = (np.arange(slots.size * 4, dtype=np.float16) + 7).reshape(
        slots.size, 1, 4)
    pages = slots[::4] // 4
    writer.publish(pages[:3], chain("killed writer", 3))
    print(" ".join(str(p) for p in pages), flush=True)
    sys.stdin.read()
"""


def test_pages_a_killed_writer_published_survive_it(prefix_daemon):
    """The writer's process is SIGKILLed after it published: the pages it
    published stay cached with its bytes, a sibling adopts them, and the
    two it did not publish come back to the free list."""
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, prefix_daemon.target,
         os.path.dirname(os.path.abspath(__file__))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=os.environ.copy())
    try:
        pages = [int(p) for p in child.stdout.readline().split()]
        assert len(pages) == 5
        with prefix_daemon.connect(name="sibling") as sibling:
            assert sibling.stats().free_pages == 11
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=20)
            wait_until(lambda: sibling.stats().free_pages == 13,
                       what="the dead writer's unpublished pages")
            stats = sibling.stats()
            assert stats.used_pages == 0
            assert (stats.prefix_published_pages, stats.prefix_cached_pages,
                    stats.prefix_evictable_pages) == (0, 3, 3)
            found = sibling.match_prefix(chain("killed writer", 3),
                                         adopt=True)
            assert found.tolist() == pages[:3]
            stats = sibling.stats()
            assert (stats.prefix_published_pages, stats.prefix_cached_pages,
                    stats.prefix_lookup_pages_total,
                    stats.prefix_hit_pages_total) == (3, 0, 3, 3)
            theirs = np.asarray(sibling.kv_buffer("k.0"))
            slots = (found[:, None] * 4 + np.arange(4)).reshape(-1)
            assert (theirs[slots].ravel() ==
                    np.arange(48, dtype=np.float16) + 7).all()
            assert sibling.free_pages(found) == 3
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert pagealloc.reset_prefix_cache(prefix_daemon.target) == 3


def test_a_key_already_published_keeps_its_page(prefix_daemon):
    keys = chain("p", 2)
    with prefix_daemon.connect() as a, prefix_daemon.connect() as b:
        first = np.asarray(a.alloc([8], return_inline=True).check().slots)
        a.publish(first[::4] // 4, keys, pin=True)
        second = np.asarray(b.alloc([8], return_inline=True).check().slots)
        published, existing = b.publish(second[::4] // 4, keys)
        assert published.tolist() == (first[::4] // 4).tolist()
        assert existing.tolist() == [True, True]
        assert b.free_pages(second[::4] // 4) == 2  # its duplicates
        assert a.unpin_prefix(first[::4] // 4) == 2


def test_bad_keys_are_refused_with_their_index(prefix_daemon):
    with prefix_daemon.connect() as client:
        slots = np.asarray(client.alloc([16], return_inline=True).check()
                           .slots)
        pages = slots[::4][:2] // 4
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match=r"keys\[1\] is 31 bytes"):
            client.publish(pages, [b"a" * 32, b"b" * 31])
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match=r"keys\[1\] repeats keys\[0\]"):
            client.publish(pages, [b"a" * 32, b"a" * 32])
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match="more than the pool's 16 pages"):
            client.match_prefix(chain("long", 17))
        with pytest.raises(pagealloc.ResourceExhaustedError,
                           match="over its bound of 2"):
            client.publish(slots[::4] // 4, chain("pins", 4), pin=True)
        assert client.match_prefix(chain("nothing", 2)).size == 0
        assert client.stats().used_pages == 4
