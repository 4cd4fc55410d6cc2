"""The pagealloc Python package end to end against a real daemon.

Every call, every error class, leases and close, and the zero-copy views:
their aliasing of the ring and what release means for them. Page ids and
slots are exact: each test starts its own daemon, so the free list starts
as 1..num_pages (docs/design.md section 1).
"""

import gc
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import weakref

import numpy as np
import pytest

import pagealloc
from pagealloc import _native
from pagealloc import StatusCode
from conftest import BACKEND, wait_until

ON_GPU = BACKEND == "cuda"
try:
    import torch
except ImportError:
    torch = None


def host(slots):
    """Slots as a host array whatever the backend (a copy on the GPU)."""
    if isinstance(slots, pagealloc.CudaSlots):
        return slots.copy_to_host()
    return np.asarray(slots)


def address_of(slots):
    if isinstance(slots, pagealloc.CudaSlots):
        return slots.ptr
    return np.asarray(slots).__array_interface__["data"][0]


# ---------------------------------------------------------------- metadata

def test_package_reports_versions_and_library():
    assert pagealloc.__version__ == "0.1.0"
    assert pagealloc.ABI_VERSION >> 16 == 1
    # The readable form the docs use ("1.8"), from the same number.
    assert pagealloc.ABI_VERSION_TEXT == "%d.%d" % (
        pagealloc.ABI_VERSION >> 16, pagealloc.ABI_VERSION & 0xFFFF)
    assert pagealloc.ABI_VERSION_TEXT == "1.11"
    assert os.path.exists(pagealloc.LIBRARY_PATH)
    # 1.6's peek, 1.7's resume, 1.8's free in one call, 1.10's take of
    # what a reserve holds and 1.11's copy to the host are declared (ctypes then checks their
    # arguments).
    assert _native.HAS_RESERVE_PEEK
    assert _native.lib.pagealloc_reserve_peek.argtypes is not None
    assert _native.HAS_RESUME
    assert _native.lib.pagealloc_resume.argtypes is not None
    assert _native.HAS_RESERVE_FREE_SLOTS
    assert _native.lib.pagealloc_reserve_free_slots.argtypes is not None
    assert _native.lib.pagealloc_reserve_disown.argtypes is not None
    assert _native.HAS_CALL_IDS
    assert _native.lib.pagealloc_calls_sent_again.argtypes is not None
    assert _native.HAS_RESERVE_TAKE_HELD
    assert _native.lib.pagealloc_reserve_take_held.argtypes is not None
    assert _native.HAS_RESERVE_PUT_UNDER
    assert _native.lib.pagealloc_reserve_put_under.argtypes is not None
    assert _native.HAS_COPY_TO_HOST
    assert _native.lib.pagealloc_copy_to_host_async.argtypes is not None


def test_status_codes_are_grpc_numbers():
    assert StatusCode.RESOURCE_EXHAUSTED == 8
    assert StatusCode.UNAUTHENTICATED == 16
    # The enum spells every code as the C ABI does (its one name table).
    names = {code.value: code.name for code in StatusCode}
    for number in range(-1, 18):
        name = _native.lib.pagealloc_status_code_name(number).decode()
        assert names.get(number, "UNKNOWN_CODE") == name, number
    error = pagealloc.error_for(9, "double free")
    assert isinstance(error, pagealloc.FailedPreconditionError)
    assert error.code is StatusCode.FAILED_PRECONDITION
    assert error.message == "double free"
    assert str(error) == "FAILED_PRECONDITION: double free"
    assert isinstance(pagealloc.error_for(3, "x"), ValueError)
    assert isinstance(pagealloc.error_for(4, "x"), TimeoutError)
    assert isinstance(pagealloc.error_for(7, "x"), PermissionError)
    assert isinstance(pagealloc.error_for(99, "x"), pagealloc.UnknownError)


# ----------------------------------------------------------------- connect

def test_connect_to_nothing_is_unavailable(tmp_path):
    with pytest.raises(pagealloc.UnavailableError) as caught:
        pagealloc.Client.connect("unix://%s/none.sock" % tmp_path,
                                 call_timeout=5.0)
    assert caught.value.code is StatusCode.UNAVAILABLE
    assert caught.value.message


def test_connect_without_a_target_looks_where_the_daemon_listens(
        daemon, monkeypatch):
    # No target: /run/pagealloc/gpu0.sock, else
    # $XDG_RUNTIME_DIR/pagealloc/gpu0.sock (an unprivileged daemon's), the
    # daemon's own order; with neither, the error names both.
    if os.path.exists("/run/pagealloc/gpu0.sock"):
        pytest.skip("a daemon listens on /run/pagealloc/gpu0.sock here")
    # Unix socket paths are limited to 107 bytes: a short directory.
    runtime = pathlib.Path(tempfile.mkdtemp(prefix="pagealloc-xdg-",
                                            dir="/tmp"))
    try:
        (runtime / "pagealloc").mkdir()
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        fallback = runtime / "pagealloc" / "gpu0.sock"
        for target in (None, ""):
            with pytest.raises(pagealloc.UnavailableError) as caught:
                pagealloc.Client.connect(target)
            assert ("looked at /run/pagealloc/gpu0.sock (No such file or "
                    "directory), %s (No such file or directory)" % fallback
                    ) in str(caught.value)
        # The daemon's socket (and its memory socket beside it) where an
        # unprivileged daemon would put them.
        socket = daemon.target[len("unix://"):]
        os.symlink(socket, fallback)
        os.symlink(socket + ".fd", str(fallback) + ".fd")
        with pagealloc.Client.connect() as client:
            assert client.alloc([4]).check().counts.tolist() == [4]
        assert pagealloc.get_free_lists(None).free_count == 16
    finally:
        shutil.rmtree(runtime)


def test_connect_refuses_bad_options():
    with pytest.raises(pagealloc.InvalidArgumentError, match="call_timeout"):
        pagealloc.Client.connect("unix:///x.sock", call_timeout=-1)


def test_session_describes_itself(daemon):
    with daemon.connect(name="describe") as client:
        assert client.session_id > 0
        assert client.lease_ms == 10000
        assert client.pool == pagealloc.PoolInfo(
            page_size=4, num_pages=16, backend=BACKEND,
            gpu=client.pool.gpu, device_uuid=client.pool.device_uuid,
            free_policy="lifo")
        assert client.uses_fast_channel
        assert client.session_token
        assert client.alive and client.session_status() is None
        assert client.ring.address != 0
        assert client.ring.capacity_slots == 1 << 20
        assert client.slots_on_device == ON_GPU
        assert client.pool.semantics == "pagealloc"
        assert client.kv_buffers() == []


# -------------------------------------------------------------- allocation

def test_alloc_extend_decode_golden(daemon):
    with daemon.connect() as client:
        first = client.alloc([4]).check()           # page 1
        assert host(first.slots).tolist() == [4, 5, 6, 7]
        # Prefix of 2 tokens in slots 4, 5; extend to 11 tokens: the rest of
        # page 1, then pages 2 and 3.
        extended = client.alloc_extend([2], [11], [5]).check()
        assert host(extended.slots).tolist() == list(range(6, 15))
        assert extended.new_pages.tolist() == [2]
        decoded = client.alloc_decode([12, 13], [14, 15])
        # Request 0 stays in page 3 (slot 15); request 1 starts page 4.
        assert host(decoded.slots).tolist() == [15, 16]
        assert decoded.new_pages.tolist() == [0, 1]
        assert client.stats().used_pages == 4


def test_allocation_exposes_requests(daemon):
    with daemon.connect() as client:
        a = client.alloc_extend([0, 0, 0], [3, 0, 5], [-1, -1, -1])
        assert len(a) == 3 and a.ok and a.num_refused == 0
        assert a.codes.dtype == np.int32 and a.codes.tolist() == [0, 0, 0]
        assert a.counts.tolist() == [3, 0, 5]
        assert a.new_pages.tolist() == [1, 0, 2]
        assert a.num_slots == 8
        results = list(a)
        assert [r.index for r in results] == [0, 1, 2]
        assert all(r.ok and r.error is None and r.message == ""
                   for r in results)
        joined = np.concatenate([host(r.slots) for r in results])
        assert joined.tolist() == host(a.slots).tolist()
        assert a[-1].count == 5 and a[-1].new_pages == 2
        with pytest.raises(IndexError):
            a[3]
        assert a.ring_end > 0 and not a.inline
        assert a.batch_requests >= 3
        assert "requests=3" in repr(a)


def test_inputs_accept_lists_arrays_and_convert(daemon):
    with daemon.connect() as client:
        as_list = client.alloc([4, 8]).check()
        as_int32 = client.alloc(np.array([4], dtype=np.int32)).check()
        strided = np.array([4, 999, 8], dtype=np.int64)[::2]
        as_strided = client.alloc(strided).check()
        as_tuple = client.alloc((4,)).check()
        assert [len(host(a.slots)) for a in (as_list, as_int32, as_strided,
                                              as_tuple)] == [12, 4, 12, 4]
        empty = client.alloc([])
        assert len(empty) == 0 and empty.num_slots == 0
        assert len(host(empty.slots)) == 0


def test_inline_results_live_in_the_allocation(daemon):
    with daemon.connect() as client:
        a = client.alloc([8], return_inline=True).check()
        assert a.inline and not a.on_device and a.ring_end == 0
        slots = a.slots
        assert isinstance(slots, np.ndarray)
        assert slots.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
        # A later ring allocation, released, does not touch inline slots.
        b = client.alloc([4]).check()
        client.release(b)
        client.flush_release()
        assert slots.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
        assert not a.released


def test_async_completion_on_cpu_is_synchronous(daemon):
    with daemon.connect() as client:
        a = client.alloc([4], async_completion=True).check()
        client.order_after_completion()
        assert host(a.slots).tolist() == [4, 5, 6, 7]


def test_free_first_and_checkpoint_first_options(daemon):
    with daemon.connect() as client:
        a = client.alloc([8]).check()                       # pages 1, 2
        b = client.alloc([4], free_pages_first=[1, 2],
                         checkpoint_first=True).check()
        assert b.pages_freed_first == 2
        assert host(b.slots).tolist() == [4, 5, 6, 7]       # lifo: page 1
        assert client.rollback() == 1
        assert client.stats().used_pages == 0
        del a


# ------------------------------------------------------------------ errors

def test_bad_arguments_are_invalid_argument_and_change_nothing(daemon):
    with daemon.connect() as client:
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match=r"seq_lens\[0\] \(1\)") as caught:
            client.alloc_extend([4], [1], [-1])
        assert caught.value.code is StatusCode.INVALID_ARGUMENT
        assert isinstance(caught.value, ValueError)
        with pytest.raises(pagealloc.InvalidArgumentError):
            client.alloc_extend([0, 0], [4], [-1, -1])      # lengths differ
        with pytest.raises(pagealloc.InvalidArgumentError):
            client.alloc([3])                               # not whole pages
        with pytest.raises(pagealloc.InvalidArgumentError):
            client.alloc_decode([5], [1])                   # slot of page 0
        # Refused in Python before the call, with the same class.
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match="one-dimensional"):
            client.alloc(np.zeros((2, 2), dtype=np.int64))
        with pytest.raises(pagealloc.InvalidArgumentError, match="dtype"):
            client.alloc([4.0])
        with pytest.raises(pagealloc.InvalidArgumentError, match="dtype"):
            client.alloc(np.array([True]))
        stats = client.stats()
        assert stats.used_pages == 0 and stats.free_pages == 16


def test_shortage_refuses_one_request_and_serves_the_others(daemon):
    with daemon.connect() as client:
        a = client.alloc([32, 64, 8])     # 8 pages, 16 pages, 2 pages of 16
        assert a.codes.tolist() == [0, int(StatusCode.RESOURCE_EXHAUSTED), 0]
        assert not a.ok and a.num_refused == 1
        refused = a[1]
        assert refused.code is StatusCode.RESOURCE_EXHAUSTED
        assert isinstance(refused.error, pagealloc.ResourceExhaustedError)
        assert refused.slots is None and refused.count == 0
        assert "needs 16 pages" in refused.message
        with pytest.raises(pagealloc.ResourceExhaustedError,
                           match="needs 16 pages"):
            a.check()
        # The refused request keeps its place in the ring: no single run.
        assert a.num_slots == -1
        with pytest.raises(ValueError, match="not one run"):
            a.slots
        assert host(a[0].slots).tolist() == list(range(4, 36))
        assert host(a[2].slots).tolist() == list(range(36, 44))
        stats = client.stats()
        assert stats.used_pages == 10 and stats.out_of_pages_total >= 1


def test_quota_refuses_per_request(daemon):
    with daemon.connect(quota_pages=2) as client:
        a = client.alloc([8, 4])
        assert a.codes.tolist() == [0, int(StatusCode.RESOURCE_EXHAUSTED)]
        assert "quota" in a[1].message


def test_free_and_its_refusals(daemon):
    with daemon.connect(name="a") as a, daemon.connect(name="b") as b:
        mine = a.alloc([8]).check()                   # pages 1, 2
        theirs = b.alloc([4]).check()                 # page 3
        assert a.free(host(mine.slots)[:5]) == 2      # slots of pages 1, 2
        with pytest.raises(pagealloc.FailedPreconditionError,
                           match="double free") as caught:
            a.free_pages([1])
        assert caught.value.code is StatusCode.FAILED_PRECONDITION
        with pytest.raises(pagealloc.PermissionDeniedError):
            a.free(host(theirs.slots))
        with pytest.raises(pagealloc.InvalidArgumentError):
            a.free_pages([0])
        with pytest.raises(pagealloc.InvalidArgumentError):
            a.free_pages([17])
        assert b.free_pages(np.array([3])) == 1
        assert a.free([]) == 0
        assert a.stats().used_pages == 0


def test_free_group_sends_one_call(daemon):
    with daemon.connect() as client:
        a = client.alloc([4, 4, 4]).check()           # pages 1, 2, 3
        with client.free_group() as group:
            group.add(a[0].slots)
            group.add(host(a[2].slots))
        assert group.pages_freed == 2
        assert client.stats().used_pages == 1
        # A block that raises sends nothing.
        with pytest.raises(RuntimeError):
            with client.free_group() as group:
                group.add(a[1].slots)
                raise RuntimeError("scheduler step failed")
        assert group.pages_freed is None
        assert client.stats().used_pages == 1
        assert client.free_group().end() == 0


def test_checkpoint_and_rollback(daemon):
    with daemon.connect() as client:
        with pytest.raises(pagealloc.FailedPreconditionError):
            client.rollback()
        kept = client.alloc([4]).check()              # page 1
        client.checkpoint()
        client.alloc([8]).check()                     # pages 2, 3
        assert client.rollback() == 2
        # Rollback returns pages to the front: the next allocation gets them.
        again = client.alloc([8]).check()
        assert host(again.slots).tolist() == list(range(8, 16))
        assert client.stats().used_pages == 3
        del kept


# ------------------------------------------- SGLang exactness and control

def test_all_or_nothing_refuses_every_request_and_changes_nothing(daemon):
    with daemon.connect() as client:
        client.alloc([8]).check()                       # pages 1, 2
        before = client.free_lists()
        exhausted = int(StatusCode.RESOURCE_EXHAUSTED)
        # 14 pages free: 2 + 13 do not fit together.
        a = client.alloc([8, 52], all_or_nothing=True)
        assert a.codes.tolist() == [exhausted, exhausted]
        assert a.num_refused == 2 and a.counts.tolist() == [0, 0]
        assert a[0].slots is None
        with pytest.raises(pagealloc.ResourceExhaustedError):
            a.check()
        e = client.alloc_extend([0, 0], [8, 52], [-1, -1],
                                all_or_nothing=True)
        assert e.codes.tolist() == [exhausted, exhausted]
        assert client.stats().used_pages == 2
        after = client.free_lists()
        assert after[0].tolist() == before[0].tolist()
        assert after.free_count == before.free_count == 14
        # Without the option the first request is served.
        assert client.alloc([8, 52]).codes.tolist() == [0, exhausted]
        assert client.stats().used_pages == 4
        client.alloc([44]).check()                      # 11 pages: 1 left
        # Decode: requests 0 and 2 start a page (after slots 7 and 11, the
        # ends of pages 1 and 2), request 1 stays in page 3 (after slot 12).
        d = client.alloc_decode([5, 6, 9], [7, 12, 11], all_or_nothing=True)
        assert d.codes.tolist() == [exhausted] * 3
        assert client.stats().used_pages == 15
        fits = client.alloc_decode([5], [7], all_or_nothing=True)
        assert fits.ok and host(fits.slots).tolist() == [64]


def test_free_order_is_visible_in_the_free_lists(daemon):
    with daemon.connect() as client:
        client.alloc([4, 4, 4]).check()                 # pages 1, 2, 3
        free, parked = client.free_lists(max_pages=3)
        assert free.dtype == np.int64 and parked.dtype == np.int64
        assert free.tolist() == [4, 5, 6] and parked.tolist() == []
        # Slots of page 3, then page 1, put back ascending (SGLang's free).
        assert client.free([12, 13, 4, 5], order="ascending") == 2
        assert client.free_lists(3)[0].tolist() == [1, 3, 4]
        client.alloc([8]).check()                       # pages 1, 3 again
        # By page id, in order of first appearance (SGLang's free_segment).
        assert client.free_pages([3, 1], order="first_appearance") == 2
        assert client.free_lists(3)[0].tolist() == [3, 1, 4]
        client.alloc([8]).check()                       # pages 3, 1 again
        # The default pool's default: first appearance.
        assert client.free([4, 12]) == 2
        assert client.free_lists(2)[0].tolist() == [1, 3]
        client.alloc([8]).check()
        with client.free_group(order="ascending") as group:
            group.add([12])
            group.add([4])
        assert group.pages_freed == 2
        assert client.free_lists(2)[0].tolist() == [1, 3]
        for bad in ("descending", 1, ""):
            with pytest.raises(pagealloc.InvalidArgumentError, match="order"):
                client.free([4], order=bad)
        with pytest.raises(pagealloc.InvalidArgumentError, match="order"):
            client.free_group(order="sorted")


def test_free_lists_are_bounded_and_count_everything(make_daemon):
    daemon = make_daemon("--num_pages=16", "--page_size=4",
                         "--free_policy=sorted")
    with daemon.connect() as client:
        client.alloc([16]).check()                      # pages 1..4
        client.free_pages([4, 2])
        lists = client.free_lists(max_pages=5)
        assert isinstance(lists, pagealloc.FreeLists)
        free, parked = lists
        assert free.tolist() == [5, 6, 7, 8, 9]
        assert lists.free_pages is free and lists.parked_pages is parked
        assert lists.free_count == 12
        assert sorted(parked.tolist()) == [2, 4] and lists.parked_count == 2
        assert "free_count=12" in repr(lists)
        empty = client.free_lists(max_pages=0)
        assert empty[0].size == 0 and empty.free_count == 12
        # The same read without a session.
        admin = pagealloc.get_free_lists(daemon.target, max_pages=5)
        assert admin[0].tolist() == free.tolist()
        assert sorted(admin[1].tolist()) == [2, 4]
        for bad in (-1, 1 << 21, 2.0, True):
            with pytest.raises(pagealloc.InvalidArgumentError,
                               match="max_pages"):
                client.free_lists(max_pages=bad)


def test_sglang_semantics_pool(make_daemon):
    daemon = make_daemon("--num_pages=16", "--page_size=4",
                         "--semantics=sglang")
    with daemon.connect() as client:
        assert client.pool.semantics == "sglang"
        assert client.stats().pool.semantics == "sglang"
        assert client.stats().pool == client.pool
        client.alloc([4, 4, 4]).check()                 # pages 1, 2, 3
        # The pool's default for slots is SGLang's: ascending.
        assert client.free([12, 13, 4, 5]) == 2
        assert client.free_lists(3)[0].tolist() == [1, 3, 4]
        # Asked for, first appearance still.
        client.alloc([8]).check()
        client.free([12, 4], order="first_appearance")
        assert client.free_lists(3)[0].tolist() == [3, 1, 4]


def test_checkpoint_ids_nest_and_end(daemon):
    with daemon.connect() as client:
        outer = client.checkpoint()
        assert isinstance(outer, int) and outer > 0
        client.alloc([4]).check()                       # page 1
        inner = client.checkpoint()
        assert inner != outer
        client.alloc([8]).check()                       # pages 2, 3
        assert client.rollback(inner) == 2
        assert client.rollback(inner) == 0              # it stays: again
        assert client.rollback(outer) == 1
        assert client.free_lists(16)[0].tolist() == list(range(1, 17))
        # The inner checkpoint ended with the rollback to the outer one.
        with pytest.raises(pagealloc.FailedPreconditionError) as caught:
            client.rollback(inner)
        assert caught.value.code is StatusCode.FAILED_PRECONDITION
        # The outer one stays until a rollback without an id ends it.
        client.alloc([4]).check()
        assert client.rollback() == 1
        with pytest.raises(pagealloc.FailedPreconditionError):
            client.rollback(outer)
        with pytest.raises(pagealloc.FailedPreconditionError):
            client.rollback()
        for bad in (0, -1, "1", True):
            with pytest.raises(pagealloc.InvalidArgumentError,
                               match="checkpoint_id"):
                client.rollback(bad)
        assert client.stats().used_pages == 0


def test_clear_session_frees_only_its_own_pages(daemon):
    with daemon.connect(name="a") as a, daemon.connect(name="b") as b:
        a.alloc([8]).check()                            # pages 1, 2
        b.alloc([4]).check()                            # page 3
        checkpoint = a.checkpoint()
        a.alloc([4]).check()                            # page 4
        assert a.clear_session() == 3
        assert a.stats().used_pages == 1
        # Its checkpoints ended with it.
        with pytest.raises(pagealloc.FailedPreconditionError):
            a.rollback(checkpoint)
        assert a.clear_session() == 0
        # b still owns page 3: it is not in the free list.
        lists = a.free_lists(16)
        assert 3 not in lists[0].tolist() and lists.free_count == 15
        assert b.clear_session() == 1
        assert a.free_lists(16)[0].tolist() == list(range(1, 17))
        assert a.alloc([4]).check().slots is not None
    closed = daemon.connect()
    closed.close()
    with pytest.raises(pagealloc.FailedPreconditionError):
        closed.clear_session()


def test_clear_pool_is_refused_while_pages_are_owned(daemon):
    with daemon.connect() as client:
        client.alloc([8]).check()
        with pytest.raises(pagealloc.FailedPreconditionError) as caught:
            pagealloc.clear_pool(daemon.target)
        assert caught.value.code is StatusCode.FAILED_PRECONDITION
        # Forcing needs the daemon's --allow_forced_clear.
        with pytest.raises(pagealloc.PermissionDeniedError):
            pagealloc.clear_pool(daemon.target, force=True)
        assert client.stats().used_pages == 2
        client.clear_session()
        assert pagealloc.clear_pool(daemon.target) == 0


def test_forced_clear_pool_frees_every_page(make_daemon):
    daemon = make_daemon("--num_pages=16", "--page_size=4",
                         "--allow_forced_clear")
    with daemon.connect() as a, daemon.connect() as b:
        a.alloc([8]).check()
        b.alloc([12]).check()
        b.free_pages([4])
        assert pagealloc.clear_pool(daemon.target, force=True) == 4
        assert a.stats().used_pages == 0
        assert a.free_lists(16)[0].tolist() == list(range(1, 17))


def test_completion_values_and_order_after(daemon):
    class TorchLike:
        cuda_stream = 0

    with daemon.connect() as client, daemon.connect() as other:
        # Asynchronous calls: each queues its own write of the counter (a
        # synchronous call on the CUDA backend carries the last value
        # queued, 0 before any asynchronous launch).
        first = client.alloc([4], async_completion=True).check()
        second = client.alloc([4], async_completion=True).check()
        assert isinstance(first.completion_value, int)
        assert 0 < first.completion_value < second.completion_value
        client.order_after(second)
        client.order_after(second, 0)
        client.order_after(first, TorchLike())
        inline = client.alloc([4], return_inline=True).check()
        client.order_after(inline)
        with pytest.raises(pagealloc.InvalidArgumentError, match="stream"):
            client.order_after(second, "stream")
        with pytest.raises(pagealloc.InvalidArgumentError, match="another"):
            other.order_after(second)
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match="Allocation"):
            client.order_after(second.slots)


# -------------------------------------------------------------- zero copy

def test_views_alias_the_ring(daemon):
    with daemon.connect() as client:
        ring = client.ring
        a = client.alloc([8]).check()
        b = client.alloc([12]).check()
        for allocation, n in ((a, 8), (b, 12)):
            start = address_of(allocation.slots)
            assert ring.address <= start
            assert start + 8 * n <= ring.address + 8 * ring.capacity_slots
        # Two allocations' regions do not overlap.
        a_start, b_start = address_of(a.slots), address_of(b.slots)
        assert a_start + 8 * 8 <= b_start or b_start + 8 * 12 <= a_start
        if not ON_GPU:
            view = a.slots
            assert view.base is not None and not view.flags.writeable
            again = np.asarray(view)
            assert np.shares_memory(again, view)
            assert not np.shares_memory(np.asarray(a.slots),
                                        np.asarray(b.slots))
            # Per-request views and the whole view share the memory too.
            assert np.shares_memory(a[0].slots, a.slots)


def test_views_keep_their_allocation_alive(daemon):
    client = daemon.connect()
    a = client.alloc([8]).check()
    slots = a.slots
    counts = a.counts
    alive = weakref.ref(a)
    del a
    gc.collect()
    assert alive() is not None            # the views hold it
    assert host(slots).tolist() == list(range(4, 12))
    assert counts.tolist() == [8]
    del slots, counts
    gc.collect()
    assert alive() is None
    client.close()


def test_release_lets_the_ring_region_be_reused(make_daemon):
    daemon = make_daemon("--num_pages=64", "--page_size=4")
    with daemon.connect(ring_capacity_slots=64) as client:
        assert client.ring.capacity_slots == 64
        a = client.alloc([32]).check()        # ring slots [0, 32)
        b = client.alloc([32]).check()        # ring slots [32, 64)
        a_view = a.slots
        a_values = host(a_view).copy()
        assert not a.released and not b.released
        # Nothing released: the ring is full and the call fails as a whole.
        with pytest.raises(pagealloc.ResourceExhaustedError, match="ring"):
            client.alloc([4])
        client.release(b)                     # releases a as well
        assert a.released and b.released
        c = client.alloc([32]).check()        # reuses [0, 32)
        assert address_of(c.slots) == address_of(a_view)
        assert address_of(c.slots) == client.ring.address
        # a's view now shows c's slots: that is what release allows.
        assert host(a_view).tolist() == host(c.slots).tolist()
        assert host(a_view).tolist() != a_values.tolist()
        with c:
            pass                              # leaving the block releases c
        assert c.released
        client.flush_release()
        d = client.alloc([4]).check()
        assert address_of(d.slots) == client.ring.address + 8 * 32


def test_release_refuses_another_clients_allocation(daemon):
    with daemon.connect() as a, daemon.connect() as b:
        allocation = a.alloc([4]).check()
        with pytest.raises(pagealloc.InvalidArgumentError):
            b.release(allocation)


# ----------------------------------------------------------- stats, close

def test_stats(daemon):
    with daemon.connect() as client, daemon.connect():
        client.alloc([8, 4]).check()
        stats = client.stats()
        assert stats.pool == client.pool
        assert stats.used_pages == 3 and stats.free_pages == 13
        assert stats.parked_pages == 0
        assert stats.sessions_active == 2
        assert stats.slots_allocated_total >= 12
        assert stats.pages_allocated_total >= 3
        assert stats.launches_total >= 1


def test_sorted_policy_parks_freed_pages(make_daemon):
    daemon = make_daemon("--num_pages=16", "--page_size=4",
                         "--free_policy=sorted")
    with daemon.connect() as client:
        assert client.pool.free_policy == "sorted"
        client.alloc([8]).check()
        client.free_pages([2, 1])
        stats = client.stats()
        assert stats.parked_pages == 2 and stats.free_pages == 14


def test_close_ends_the_session(daemon):
    observer = daemon.connect(name="observer")
    client = daemon.connect()
    allocation = client.alloc([8]).check()
    slots = allocation.slots
    assert observer.stats().used_pages == 2
    client.close()
    client.close()                                  # twice is fine
    status = client.session_status()
    assert isinstance(status, pagealloc.FailedPreconditionError)
    assert not client.alive
    with pytest.raises(pagealloc.FailedPreconditionError, match="closed"):
        client.alloc([4])
    with pytest.raises(pagealloc.FailedPreconditionError):
        client.free_pages([1])
    with pytest.raises(pagealloc.FailedPreconditionError):
        client.checkpoint()
    # docs/python.md: the pool reads need no session and still answer.
    assert client.stats().used_pages == 0
    assert client.free_lists(4).free_count == 16
    assert observer.stats().used_pages == 0
    assert observer.stats().sessions_active == 1
    # The views stay mapped after close (no crash reading them).
    assert len(host(slots)) == 8
    with daemon.connect() as scoped:
        scoped.alloc([4]).check()
    assert observer.stats().used_pages == 0
    observer.close()


_FROZEN_CLIENT = r"""
import sys
import pagealloc
client = pagealloc.Client.connect(sys.argv[1], name="frozen")
client.alloc([8]).check()
print("ready", flush=True)
sys.stdin.readline()
# The call first: it fails whether or not the client has yet read the
# daemon's word on its memory socket, and after it the session is gone.
try:
    client.alloc([4])
    alloc = "alloc OK"
except pagealloc.PageallocError as e:
    alloc = "alloc " + e.code.name
status = client.session_status()
print("status", status.code.name if status else "OK", flush=True)
print(alloc, flush=True)
"""


def test_lost_lease_ends_the_session(make_daemon):
    daemon = make_daemon("--num_pages=16", "--page_size=4", "--lease_ms=300")
    child = subprocess.Popen([sys.executable, "-c", _FROZEN_CLIENT,
                              daemon.target], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with daemon.connect(name="observer") as observer:
            assert observer.stats().used_pages == 2
            child.send_signal(signal.SIGSTOP)   # no more keepalives
            wait_until(lambda: observer.stats().used_pages == 0,
                       what="the daemon to reclaim the frozen session")
        child.send_signal(signal.SIGCONT)
        child.stdin.write("go\n")
        child.stdin.flush()
        status = child.stdout.readline().split()
        alloc = child.stdout.readline().split()
        assert status[0] == "status" and status[1] != "OK"
        assert alloc[0] == "alloc" and alloc[1] != "OK"
        assert alloc[1] in ("NOT_FOUND", "UNAVAILABLE", "UNAUTHENTICATED")
        assert child.wait(timeout=20) == 0
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait()


def test_daemon_death_ends_the_session(daemon):
    client = daemon.connect()
    client.alloc([4]).check()
    daemon.kill()
    wait_until(lambda: client.session_status() is not None,
               what="the client to see the daemon go")
    assert isinstance(client.session_status(), pagealloc.PageallocError)
    with pytest.raises(pagealloc.PageallocError):
        client.alloc([4])
    client.close()


# --------------------------------------------------------------- threads

def test_one_client_from_several_threads(daemon):
    with daemon.connect() as client:
        errors = []
        got = []

        def work():
            try:
                for _ in range(20):
                    a = client.alloc([4]).check()
                    got.append(int(host(a.slots)[0]))
                    client.free(host(a.slots))
                    client.release(a)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(got) == 80
        assert client.stats().used_pages == 0


# ------------------------------------------------------ streams and torch

def test_order_after_completion_accepts_stream_forms(daemon):
    class TorchLike:
        cuda_stream = 0

    with daemon.connect() as client:
        client.order_after_completion()
        client.order_after_completion(0)
        client.order_after_completion(TorchLike())
        with pytest.raises(pagealloc.InvalidArgumentError, match="stream"):
            client.order_after_completion("stream")


@pytest.mark.skipif(torch is None, reason="torch is not installed here: "
                    "tensor inputs and torch views are checked where it is")
def test_torch_cpu_tensors_in_and_views_out(daemon):
    with daemon.connect() as client:
        a = client.alloc_extend(torch.tensor([0]), torch.tensor([8]),
                                torch.tensor([-1])).check()
        assert host(a.slots).tolist() == list(range(4, 12))
        if ON_GPU:
            return
        with pytest.warns(UserWarning):       # the ring is read-only
            tensor = torch.as_tensor(a.slots)
        assert tensor.data_ptr() == address_of(a.slots)
        if torch.cuda.is_available():
            with pytest.raises(pagealloc.InvalidArgumentError, match="cuda"):
                client.alloc(torch.tensor([4], device="cuda"))


@pytest.mark.skipif(not ON_GPU, reason="CUDA backend only "
                    "(PAGEALLOC_TEST_BACKEND=cuda on a GPU host)")
def test_cuda_slots_are_zero_copy_for_torch(daemon):
    assert torch is not None, "the GPU check needs torch"
    with daemon.connect() as client:
        a = client.alloc([8, 4]).check()
        slots = a.slots
        assert isinstance(slots, pagealloc.CudaSlots)
        interface = slots.__cuda_array_interface__
        assert interface["version"] == 3 and interface["stream"] is None
        tensor = torch.as_tensor(slots, device="cuda")
        assert tensor.data_ptr() == slots.ptr
        assert tensor.dtype == torch.int64
        assert tensor.cpu().tolist() == list(range(4, 16))
        per_request = torch.as_tensor(a[1].slots, device="cuda")
        assert per_request.data_ptr() == slots.ptr + 8 * 8


@pytest.mark.skipif(not ON_GPU, reason="CUDA backend only "
                    "(PAGEALLOC_TEST_BACKEND=cuda on a GPU host)")
def test_stream_waits_for_async_completion_without_host_sync(daemon):
    assert torch is not None, "the GPU check needs torch"
    with daemon.connect() as client:
        stream = torch.cuda.Stream()
        for i in range(50):
            a = client.alloc([4, 8], async_completion=True).check()
            client.order_after_completion(stream)
            with torch.cuda.stream(stream):
                t = torch.as_tensor(a.slots, device="cuda")
                total = (t + 0).sum()
            stream.synchronize()
            assert int(total) == int(host(a.slots).sum())
            client.free(host(a.slots))
            client.release(a)


@pytest.mark.skipif(not ON_GPU, reason="CUDA backend only "
                    "(PAGEALLOC_TEST_BACKEND=cuda on a GPU host)")
def test_cuda_slots_are_zero_copy_for_cupy(daemon):
    cupy = pytest.importorskip("cupy")
    with daemon.connect() as client:
        a = client.alloc([8]).check()
        array = cupy.asarray(a.slots)
        assert array.data.ptr == a.slots.ptr
        assert array.get().tolist() == list(range(4, 12))


# ------------------------------------------------------------ page reserves

def settled(reserve):
    """Waits for the refill a take below the low mark asks of the reserve's
    thread: once the reserve holds its batch again the thread moves no
    page until a take or a put crosses a mark."""
    def refilled():
        stats = reserve.stats()
        return stats["pages"] >= stats["batch"]
    wait_until(refilled, what="the reserve's thread to refill")


def test_frees_fenced_on_a_stream_wait_for_the_release_word(daemon):
    with daemon.connect(name="fence") as client, \
            daemon.connect(name="grpc", fast_channel=False) as slow:
        with client.reserve(initial_batch=2, max_pages=8) as reserve:
            pages = reserve.take(3)
            # The counts below are the session's pages, the reserve's among
            # them: its thread's refill must be done before they are read.
            settled(reserve)
            used = client.stats().used_pages
            # Value 5 is not queued yet: the page stays the session's.
            assert client.free_pages_after(pages[:1], 5) == 1
            assert client.stats().used_pages == used
            with pytest.raises(pagealloc.FailedPreconditionError,
                               match="double free"):
                client.free_pages(pages[:1])
            # On the CPU backend a stream free writes the word (1) at once.
            assert client.free_pages(pages[1:2], stream=0) == 1
            assert client.stats().used_pages == used - 1
            assert [client.queue_release() for _ in range(4)] == [2, 3, 4, 5]
            # The release poller frees page 1 (a bound on a wait).
            wait_until(lambda: client.stats().used_pages == used - 2,
                       what="the fenced page to be freed")
            reserve.put(pages[2:], stream=0)
            # The two pages freed straight to the daemon stay counted as
            # handed out: the reserve knows only what passed through it.
            assert reserve.stats()["handed_out"] == 2
        slow_pages = slow.reserve(initial_batch=1, max_pages=2).take(1)
        with pytest.raises(pagealloc.FailedPreconditionError,
                           match="no release word"):
            slow.free_pages(slow_pages, stream=0)
        assert slow.free_pages(slow_pages) == 1


def test_reserve_hands_out_the_sessions_pages(daemon):
    with daemon.connect(name="reserve") as client, \
            daemon.connect(name="other") as other:
        with pytest.raises(pagealloc.InvalidArgumentError, match="tick"):
            client.reserve(tick=0)
        with client.reserve(initial_batch=2, max_pages=8) as reserve:
            pages = reserve.take(3)
            assert pages.dtype == np.int64 and pages.size == 3
            assert len(set(pages.tolist())) == 3
            assert all(1 <= p <= 16 for p in pages.tolist())
            # The pages are the session's in the daemon's pool: another
            # session naming them is refused and nothing changes.
            settled(reserve)
            used = client.stats().used_pages
            with pytest.raises(pagealloc.PermissionDeniedError,
                               match="belongs to another session"):
                other.free_pages(pages)
            assert client.stats().used_pages == used
            reserve.put(pages[:2])
            with pytest.raises(pagealloc.InvalidArgumentError,
                               match="not handed out"):
                reserve.put(pages[:1])
            stats = reserve.stats()
            assert stats["handed_out"] == 1 and stats["takes"] == 1
            assert stats["refills"] >= 1
            with pytest.raises(pagealloc.ResourceExhaustedError):
                reserve.take(17)            # more than the pool holds
            assert reserve.stats()["handed_out"] == 1
        with pytest.raises(pagealloc.FailedPreconditionError, match="closed"):
            reserve.take(1)
        # Closing returned the reserve; the page taken stays the session's.
        assert client.stats().used_pages == 1


def reserve_of_eight(client):
    """A reserve of low mark 4, aim and high mark 8, once its thread's
    first refill has brought the 8 pages: holding 4 to 8 pages, it is the
    thread's to leave alone, so nothing lands on top between two calls."""
    reserve = client.reserve(initial_batch=4, max_pages=8)
    wait_until(lambda: reserve.stats()["pages"] == 8,
               what="the reserve's first refill")
    return reserve


def test_reserve_take_held_takes_only_what_it_holds(daemon):
    with daemon.connect(name="held") as client:
        with reserve_of_eight(client) as reserve:
            top = reserve.peek(8)
            first = reserve.take_held(3)
            assert first.dtype == np.int64
            assert first.tolist() == top[:3].tolist()
            rest = reserve.take_held(100)  # more than it holds: its 5
            assert rest.tolist() == top[3:].tolist()
            assert reserve.take_held(0).size == 0
            stats = reserve.stats()
            assert stats["handed_out"] == 8 and stats["sync_refills"] == 0
            reserve.put(np.concatenate((first, rest)))
            with pytest.raises(pagealloc.InvalidArgumentError,
                               match="not handed out"):
                reserve.put(first[:1])
            with pytest.raises(pagealloc.InvalidArgumentError,
                               match="max_pages"):
                reserve.take_held(-1)
        with pytest.raises(pagealloc.FailedPreconditionError, match="closed"):
            reserve.take_held(1)
        assert client.stats().used_pages == 0


def test_reserve_put_under_queues_pages_behind_what_it_holds(daemon):
    with daemon.connect(name="under") as client:
        with reserve_of_eight(client) as reserve:
            top = reserve.peek(8)
            taken = reserve.take(3)
            reserve.put_under(taken[::-1])
            assert reserve.peek(8).tolist() == (top[3:].tolist() +
                                                taken[::-1].tolist())
            again = reserve.take(2)
            reserve.put_under(again, stream=0)  # fenced: the release at once
            assert reserve.peek(8)[-2:].tolist() == again.tolist()
            with pytest.raises(pagealloc.InvalidArgumentError,
                               match="not handed out"):
                reserve.put_under(again[:1])
            stats = reserve.stats()
            assert stats["pages"] == 8 and stats["handed_out"] == 0
        assert client.stats().used_pages == 0


def test_reserve_frees_whole_pages_of_slots_in_one_call(daemon):
    """PageReserve.free_slots: whole pages of slots go back on the reserve's
    top, the first named taken next; anything else is refused with nothing
    put; a page the reserve let go of (disown: published) is refused."""
    with daemon.connect(name="frees") as client, \
            client.reserve(initial_batch=2, max_pages=8) as reserve:
        a, b, c = (int(p) for p in reserve.take(3))

        def slots_of(*pages):
            return np.array([p * 4 + k for p in pages for k in range(4)],
                            dtype=np.int64)

        out = np.full(4, -1, dtype=np.int64)
        before = reserve.stats()["handed_out"]
        for slots, words in (
                (slots_of(a)[:3], "not whole pages"),
                (slots_of(a)[[1, 0, 2, 3]], "not one whole page"),
                (slots_of(a) + 1, "not one whole page"),
                (slots_of(a, a), "named twice"),
                (slots_of(17), "not handed out")):
            with pytest.raises(pagealloc.InvalidArgumentError, match=words):
                reserve.free_slots(slots, out)
            assert reserve.stats()["handed_out"] == before
        with pytest.raises(pagealloc.InvalidArgumentError, match="room for"):
            reserve.free_slots(slots_of(a, b), out[:1])
        with pytest.raises(pagealloc.InvalidArgumentError, match="int64"):
            reserve.free_slots(slots_of(a), out.astype(np.int32))
        # b is published, say: the reserve lets go of it, once.
        assert reserve.disown([b, b, 99]) == 1
        assert reserve.disown([b]) == 0
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match="not handed out"):
            reserve.free_slots(slots_of(c, b), out)
        assert reserve.free_slots(slots_of(c, a), out) == 2
        assert out[:2].tolist() == [c, a]
        assert reserve.take(2).tolist() == [c, a]
        assert reserve.free_slots(np.zeros(0, dtype=np.int64), out) == 0
        # The fenced form on the CPU backend frees as the host calls.
        assert reserve.free_slots(slots_of(a), out, stream=0, fence=True) == 1
        assert reserve.stats()["handed_out"] == 1  # c (b is disowned)


# ------------------------------------------------- slots expanded in process

def test_reserve_expands_extend_and_decode_in_process(daemon):
    with daemon.connect(name="local") as client, \
            client.reserve(initial_batch=2, max_pages=8) as reserve:
        prefix_page = int(reserve.take(1)[0])
        # A 2-token prefix in prefix_page, extended to 11 tokens and, in
        # the same batch, an empty prefix to 3.
        slots = reserve.alloc_extend([2, 0], [11, 3],
                                     np.array([prefix_page * 4 + 1, -1]))
        assert slots.dtype == np.int64 and slots.size == 12
        assert slots[:2].tolist() == [prefix_page * 4 + 2, prefix_page * 4 + 3]
        # Whole new pages from their first slot, none the prefix's: two for
        # the first request (4 + 3 slots), one for the second (3 slots).
        q, r, t = int(slots[2]) // 4, int(slots[6]) // 4, int(slots[9]) // 4
        assert slots[2:].tolist() == ([q * 4 + k for k in range(4)] +
                                      [r * 4 + k for k in range(3)] +
                                      [t * 4 + k for k in range(3)])
        assert len({prefix_page, q, r, t}) == 4
        # A decode continues the last page; into a given buffer.
        out = np.full(4, -7, dtype=np.int64)
        got = reserve.alloc_decode([12], [int(slots[8])], out=out)
        assert got.tolist() == [int(slots[8]) + 1]
        assert out[1:].tolist() == [-7, -7, -7]
        assert reserve.stats()["handed_out"] == 4


def test_reserve_expansion_refusals_take_nothing(daemon):
    with daemon.connect(name="local") as client, \
            client.reserve(initial_batch=2, max_pages=8) as reserve:
        prefix_page = int(reserve.take(1)[0])
        handed = reserve.stats()["handed_out"]
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match=r"seq_lens\[1\] \(3\) < prefix_lens\[1\] "
                                 r"\(5\)"):
            reserve.alloc_extend([2, 5], [4, 3], [prefix_page * 4 + 1, 0])
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match=r"last_locs\[0\] \(%d\) lies in page %d" %
                           (((prefix_page % 16) + 1) * 4 + 1,
                            (prefix_page % 16) + 1)):
            reserve.alloc_extend([2], [4], [((prefix_page % 16) + 1) * 4 + 1])
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match="prefix_lens has 1 entries and seq_lens 2"):
            reserve.alloc_extend([1], [2, 3], [0, 0])
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match="out has 1 entries"):
            reserve.alloc_extend([0], [3], [-1],
                                 out=np.zeros(1, dtype=np.int64))
        # More pages than the pool holds: SGLang's None.
        with pytest.raises(pagealloc.ResourceExhaustedError):
            reserve.alloc_extend([0], [17 * 4], [-1])
        assert reserve.stats()["handed_out"] == handed
        reserve.take_device_error()  # none: no device call was made
