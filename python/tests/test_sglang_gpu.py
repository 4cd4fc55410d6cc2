"""pagealloc.sglang on the CUDA backend against SGLang's own Triton kernels.

Runs on a GPU host only, with PyTorch, Triton and the seed's kernels: set
PAGEALLOC_SGLANG_ANCHOR_DIR to the folder holding seed_triton_kernels.py
(SGLang's alloc_extend_kernel and alloc_decode_kernel; reference material
the repository does not carry). Each case skips with its reason elsewhere.

    PAGEALLOC_TEST_BACKEND=cuda PAGEALLOC_SERVER=.../pagealloc-server \\
    PAGEALLOC_LIBRARY=.../libpagealloc_client.so \\
    PAGEALLOC_SGLANG_ANCHOR_DIR=/path/to/bench PYTHONPATH=python:python/tests \\
    python3 -m pytest -rs python/tests/test_sglang_gpu.py

The reference runs in this process on the same calls: the free list of
pagealloc.sglang_model, handed to SGLang's kernels on the GPU exactly as
SGLang's allocator hands its own (a device tensor, the batch's lengths,
last_loc), so its slots are SGLang's. The drop-in's tensors must be
identical, slot for slot, on a long random trace.
"""

import contextlib
import importlib.util
import os

import numpy as np
import pytest

from conftest import BACKEND

try:
    import torch
except ImportError:
    torch = None

ANCHOR_DIR = os.environ.get("PAGEALLOC_SGLANG_ANCHOR_DIR", "")


def _skip_reason():
    if BACKEND != "cuda":
        return "PAGEALLOC_TEST_BACKEND is %r, not 'cuda'" % BACKEND
    if torch is None:
        return "PyTorch is not importable"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device"
    if not ANCHOR_DIR or not os.path.isfile(
            os.path.join(ANCHOR_DIR, "seed_triton_kernels.py")):
        return ("PAGEALLOC_SGLANG_ANCHOR_DIR (%r) holds no "
                "seed_triton_kernels.py" % ANCHOR_DIR)
    if importlib.util.find_spec("triton") is None:
        return "Triton is not importable"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None,
                                reason=str(_skip_reason()))


def _kernels():
    spec = importlib.util.spec_from_file_location(
        "seed_triton_kernels",
        os.path.join(ANCHOR_DIR, "seed_triton_kernels.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _npow2(n):
    return 1 << max(0, int(n - 1).bit_length())


class TritonReference:
    """SGLang's allocator calls: the model's free list, SGLang's kernels."""

    def __init__(self, model, page_size):
        self.model = model
        self.ps = page_size
        self.kernels = _kernels()

    def _free_pages(self):
        # Padded: on a shortage SGLang's kernels read past the list before
        # the call returns None; here they read zeros inside the tensor.
        padded = np.zeros(len(self.model.free_pages) + self.model.num_pages +
                          1, dtype=np.int64)
        padded[:len(self.model.free_pages)] = self.model.free_pages
        return torch.as_tensor(padded, device="cuda")

    def alloc_extend(self, prefix, seq, last, n):
        # The model decides the merge and the None exactly as SGLang does;
        # the slots come from SGLang's kernel over the list it read.
        bs = len(prefix)
        if self.model.need_sort and n // self.ps + bs + 1 > len(
                self.model.free_pages):
            self.model.merge_and_sort_free()
        free = self._free_pages()
        out = torch.empty((n,), dtype=torch.int64, device="cuda")
        self.kernels.alloc_extend_kernel[(bs,)](
            torch.as_tensor(prefix, device="cuda"),
            torch.as_tensor(seq, device="cuda"),
            torch.as_tensor(last, device="cuda"), free, out, _npow2(bs),
            self.ps)
        want = self.model.alloc_extend(prefix, seq, last, n)
        if want is None:
            return None
        np.testing.assert_array_equal(out.cpu().numpy(), want)
        return out

    def alloc_decode(self, seq, last):
        bs = len(seq)
        if self.model.need_sort and bs > len(self.model.free_pages):
            self.model.merge_and_sort_free()
        free = self._free_pages()
        out = torch.empty((bs,), dtype=torch.int64, device="cuda")
        self.kernels.alloc_decode_kernel[(bs,)](
            torch.as_tensor(seq, device="cuda"),
            torch.as_tensor(last, device="cuda"), free, out, _npow2(bs),
            self.ps)
        want = self.model.alloc_decode(seq, last)
        if want is None:
            return None
        np.testing.assert_array_equal(out.cpu().numpy(), want)
        return out


@pytest.mark.parametrize("page_size,policy", [(16, "lifo"), (16, "sorted"),
                                              (64, "lifo")])
def test_slots_equal_sglangs_kernels(make_daemon, page_size, policy):
    from pagealloc import sglang
    from pagealloc.sglang_model import make_allocator_model

    num_pages = 256
    daemon = make_daemon("--semantics=sglang", "--page_size=%d" % page_size,
                         "--num_pages=%d" % num_pages,
                         "--free_policy=%s" % policy)
    rng = np.random.default_rng(page_size)
    with daemon.connect(name="gpu-trace") as client:
        allocator = sglang.make_allocator(client, device="cuda",
                                          use_reserve=False)
        model = make_allocator_model(num_pages * page_size, page_size,
                                     policy == "sorted")
        ref = TritonReference(model, page_size)
        rows = {}
        next_id = 0
        for step in range(1500):
            r = rng.random()
            if r < 0.35 or not rows:
                batch = list(rng.permutation(list(rows))[:rng.integers(0, 8)])
                for _ in range(int(rng.integers(1, 8))):
                    next_id += 1
                    rows[next_id] = []
                    batch.append(next_id)
                prefix = np.array([len(rows[i]) for i in batch], np.int64)
                ext = rng.integers(0, 4 * page_size, size=len(batch))
                seq = prefix + ext
                last = np.array([rows[i][-1] if rows[i] else -1
                                 for i in batch], np.int64)
                n = int(ext.sum())
                prefix_d = torch.as_tensor(prefix, device="cuda")
                seq_d = torch.as_tensor(seq, device="cuda")
                got = allocator.alloc_extend(
                    prefix_d, torch.as_tensor(prefix), seq_d,
                    torch.as_tensor(seq), torch.as_tensor(last,
                                                          device="cuda"), n)
                want = ref.alloc_extend(prefix, seq, last, n)
                lengths = ext
            elif r < 0.8:
                batch = list(rng.permutation(list(rows))[:rng.integers(1, 64)])
                batch = [i for i in batch if rows[i]]
                if not batch:
                    continue
                seq = np.array([len(rows[i]) + 1 for i in batch], np.int64)
                last = np.array([rows[i][-1] for i in batch], np.int64)
                got = allocator.alloc_decode(
                    torch.as_tensor(seq, device="cuda"), torch.as_tensor(seq),
                    torch.as_tensor(last, device="cuda"))
                want = ref.alloc_decode(seq, last)
                lengths = np.ones(len(batch), np.int64)
            else:
                for i in list(rng.permutation(list(rows))[:rng.integers(1, 6)]):
                    row = np.array(rows.pop(i), np.int64)
                    allocator.free(torch.as_tensor(row, device="cuda"))
                    model.free(row)
                continue
            if want is None:
                assert got is None, "step %d: SGLang None" % step
                for i in batch:
                    if not rows[i]:
                        del rows[i]
                continue
            assert got is not None, "step %d: SGLang served it" % step
            assert got.device.type == "cuda" and got.dtype == torch.int64
            assert torch.equal(got, want), "step %d" % step
            out = got.cpu().tolist()
            at = 0
            for i, k in zip(batch, lengths):
                rows[i].extend(out[at:at + int(k)])
                at += int(k)
            for i in batch:
                if not rows[i]:
                    del rows[i]
            free, _ = client.free_lists(max_pages=num_pages)
            np.testing.assert_array_equal(free, model.free_pages)


def test_stream_reads_slots_after_the_daemon_without_host_sync(make_daemon):
    """The current stream is ordered after the daemon's kernel on the GPU:
    a stream held back by a long kernel (about a second) still reads the
    call's slots, and the call returns while that stream is still busy, so
    it did not wait for it. last_loc is given on the host here: a CUDA
    last_loc is copied on its stream, which would wait for the long
    kernel."""
    from pagealloc import sglang

    daemon = make_daemon("--semantics=sglang", "--page_size=16",
                         "--num_pages=1024")
    with daemon.connect() as client:
        allocator = sglang.make_allocator(client, device="cuda",
                                          use_reserve=False)
        allocator.alloc(16)  # builds the ring's tensor outside the timing
        # The first launch of a kernel loads its module (CUDA's lazy
        # loading), which waits for the device: load the multiply's now.
        (torch.ones(1, dtype=torch.int64, device="cuda") * 2).cpu()
        stream = torch.cuda.Stream()
        seq = torch.full((256,), 1, dtype=torch.int64)
        last = torch.full((256,), -1, dtype=torch.int64)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(2_000_000_000)
            out = allocator.alloc_decode(seq, seq, last)
            doubled = out * 2           # queued behind the sleep
            assert not stream.query(), "the call waited for the stream"
        stream.synchronize()
        want = np.arange(2, 258, dtype=np.int64) * 16
        np.testing.assert_array_equal(doubled.cpu().numpy(), want * 2)


@contextlib.contextmanager
def _lone_allocator(make_daemon):
    """pagealloc.sglang's paged allocator on a CUDA device, the only
    session of a new daemon of 64 pages of 16, its reserve the whole pool
    (so its pages come in the pool's order)."""
    from pagealloc import sglang

    daemon = make_daemon("--semantics=sglang", "--page_size=16",
                         "--num_pages=64")
    with daemon.connect() as client:
        allocator = sglang.make_allocator(
            client, device="cuda", reserve_options=dict(
                max_pages=64, initial_batch=64, starved_wait=0))
        yield allocator
        allocator.close()


def test_reserve_alloc_reaches_the_device_without_host_sync(make_daemon):
    """alloc(n) from the page reserve: the slots come to the CUDA device in
    one copy on the current stream, queued behind a long kernel (about a
    second) without the call waiting for it, and they are the pool's first
    pages in order (one session, the reserve the whole pool)."""
    with _lone_allocator(make_daemon) as allocator:
        # Loads the copy's path and puts page 1 back on top.
        allocator.free(allocator.alloc(16))
        (torch.ones(1, dtype=torch.int64, device="cuda") * 2).cpu()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(2_000_000_000)
            outs = [allocator.alloc(32) for _ in range(4)]
            doubled = [out * 2 for out in outs]  # queued behind the sleep
            assert not stream.query(), "the call waited for the stream"
        stream.synchronize()
        for i, out in enumerate(doubled):
            assert out.device.type == "cuda"
            want = np.arange(16 + 32 * i, 48 + 32 * i, dtype=np.int64)
            np.testing.assert_array_equal(out.cpu().numpy(), want * 2)


def test_a_free_of_device_slots_reads_them_after_the_stream(make_daemon):
    """free() of a CUDA tensor (int64 or SGLang's int32 req_to_token rows)
    in one library call: it reads the slots once the current stream has
    run the work queued before the free (here a long kernel, then the
    kernel that writes the slots), puts the pages back on the reserve's top
    in the order named, and the next alloc is a slice of the device mirror
    with those slots. A partial page is refused and nothing changes."""
    with _lone_allocator(make_daemon) as allocator:
        first = allocator.alloc(48)     # pages 1, 2, 3
        want = first.cpu().numpy()
        available = allocator.available_size()
        with pytest.raises(Exception, match="complete page blocks"):
            allocator.free(first[:15])
        assert allocator.available_size() == available
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(200_000_000)
            # Pages 3 then 1, written behind the sleep.
            named = torch.cat((first[32:], first[:16])) + 0
            allocator.free(named)
            assert stream.query(), "the free did not wait for its stream"
        assert allocator.available_size() == available + 32
        hits = allocator.mirror_stats["hits"]
        again = allocator.alloc(32)
        assert allocator.mirror_stats["hits"] == hits + 1
        np.testing.assert_array_equal(
            again.cpu().numpy(), np.concatenate((want[32:], want[:16])))
        # SGLang's int32 rows, pages 2 and 3.
        allocator.free(torch.cat((first[16:32], again[:16])).to(torch.int32))
        assert allocator.available_size() == available + 32
        third = allocator.alloc(32)
        np.testing.assert_array_equal(
            third.cpu().numpy(), np.concatenate((want[16:32], want[32:])))
        # A strided view (every other slot of a wider row): page 3.
        row = torch.zeros(32, dtype=torch.int64, device="cuda")
        row[::2] = third[16:]
        allocator.free(row[::2])
        assert allocator.available_size() == available + 16


def test_reserve_legacy_calls_expand_on_the_stream_without_host_sync(
        make_daemon):
    """alloc_extend and alloc_decode on the page reserve read a CUDA
    last_loc where it is: the slots are written on the current stream,
    queued behind a long kernel (about a second) without the call waiting
    for it, and they are the pool's first pages in order (one session, the
    reserve the whole pool)."""
    with _lone_allocator(make_daemon) as allocator:
        # (Filling the reserve with the pool may have refilled on this
        # thread once, when its own thread had not started yet.)
        refills = allocator.reserve.stats()["sync_refills"]
        zeros = torch.zeros(4, dtype=torch.int64)
        seq = torch.full((4,), 10, dtype=torch.int64)
        out = allocator.alloc_extend(
            zeros.cuda(), zeros, seq.cuda(), seq,
            torch.full((4,), -1, dtype=torch.int64, device="cuda"), 40)
        assert out.device.type == "cuda"
        want = np.concatenate([np.arange(10) + 16 * p for p in (1, 2, 3, 4)])
        np.testing.assert_array_equal(out.cpu().numpy(), want)
        last = out.reshape(4, 10)[:, -1].contiguous()
        # The device lengths are made before the sleep: a copy from
        # pageable host memory on the busy stream would wait for it.
        seq_dev = (seq + 1).cuda()
        (torch.ones(1, dtype=torch.int64, device="cuda") * 2).cpu()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(2_000_000_000)
            step = allocator.alloc_decode(seq_dev, seq + 1, last)
            doubled = step * 2           # queued behind the sleep
            assert not stream.query(), "the call waited for the stream"
        stream.synchronize()
        np.testing.assert_array_equal(
            doubled.cpu().numpy(),
            np.array([26, 42, 58, 74], dtype=np.int64) * 2)
        assert allocator.reserve.stats()["sync_refills"] == refills
        allocator.reserve.take_device_error()  # no last_loc was refused
        # The requests' whole pages go back into the reserve.
        pages = torch.arange(1, 5, dtype=torch.int64)
        allocator.free((pages[:, None] * 16 + torch.arange(16)).reshape(-1))
        assert allocator.reserve.stats()["pages"] == 64


def test_a_token_free_of_cuda_slots_does_not_wait_for_the_stream(
        make_daemon):
    """At page size 1 a free of CUDA slots queues their copy to the host
    and returns while the stream is still busy (a long kernel, then the
    kernel that writes the slots); it counts as freed at once, and the
    slots come back at the free list's end in the order freed, as
    SGLang's token allocator appends them (one session, its reserve the
    whole pool). A free group's CUDA frees are one such free. A free that
    names a slot twice raises at the call that reads it, and frees none of
    its slots."""
    from pagealloc import InvalidArgumentError, sglang

    daemon = make_daemon("--semantics=sglang", "--page_size=1",
                         "--num_pages=256")
    with daemon.connect() as client:
        allocator = sglang.make_allocator(
            client, device="cuda", reserve_options=dict(
                max_pages=256, initial_batch=256, starved_wait=0))
        first = allocator.alloc(8)
        np.testing.assert_array_equal(first.cpu().numpy(), np.arange(1, 9))
        available = allocator.available_size()
        assert available == 248
        # Loads the kernels used below outside the busy stream (CUDA loads
        # a kernel at its first launch, which waits for the device).
        warm = first[[0]] + 0
        torch.cat([warm.to(torch.int32).reshape(-1).to(torch.int64),
                   warm.reshape(-1)]).cpu()
        # Pinned blocks for the two frees' copies, in PyTorch's cache: a
        # new one is a cudaHostAlloc.
        pinned = [torch.empty((8,), dtype=torch.int64, pin_memory=True)
                  for _ in range(2)]
        del pinned
        # The indices on the device beforehand: a host index is copied up
        # by a blocking copy, which would wait for the busy stream itself.
        index = [torch.tensor(i, dtype=torch.int64, device="cuda")
                 for i in ([4, 5, 6, 7], [0], [1])]
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(2_000_000_000)
            allocator.free(first[index[0]] + 0)          # slots 5..8
            allocator.free_group_begin()
            allocator.free(first[index[1]] + 0)          # slot 1
            allocator.free(first[index[2]].to(torch.int32))  # slot 2, int32
            allocator.free_group_end()
            assert not stream.query(), "a free waited for its stream"
            assert allocator.available_size() == available + 6
        stream.synchronize()
        # Everything left, then the freed slots in the order freed.
        rest = allocator.alloc(available + 6)
        np.testing.assert_array_equal(
            rest.cpu().numpy(),
            np.concatenate((np.arange(9, 257), [5, 6, 7, 8, 1, 2])))
        allocator.free(rest[:-6])
        with torch.cuda.stream(stream):
            twice = torch.tensor([3, 3], dtype=torch.int64, device="cuda")
            torch.cuda._sleep(200_000_000)
            allocator.free(twice)  # lands after the sleep: read later
        stream.synchronize()
        with pytest.raises(InvalidArgumentError, match="earlier free.*twice"):
            allocator.free_page_ids([4])  # reads the free of [3, 3] first
        allocator.free_page_ids([4])
        allocator.free(torch.tensor([3], dtype=torch.int64, device="cuda"))
        assert allocator.available_size() == 256 - 6
        allocator.close()
