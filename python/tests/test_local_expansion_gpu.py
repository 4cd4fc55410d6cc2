"""PageReserve.alloc_extend / alloc_decode with a CUDA last_loc (torch):
the slots written on the caller's stream equal the host path's on the same
reserve pages, and a last_loc past the slab goes to page 0 and is
reported. Runs where PyTorch sees a CUDA device (the daemon may be either
backend: the expansion runs in this process); each case skips elsewhere.

    PAGEALLOC_SERVER=.../pagealloc-server \\
    PAGEALLOC_LIBRARY=.../libpagealloc_client.so \\
    PYTHONPATH=python:python/tests \\
    python3 -m pytest -rs python/tests/test_local_expansion_gpu.py
"""

import numpy as np
import pytest

import pagealloc

try:
    import torch
except ImportError:
    torch = None


def _skip_reason():
    if torch is None:
        return "PyTorch is not importable"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None,
                                reason=str(_skip_reason()))


def _new_pages(slots, page_size, prefix_pages):
    """The pages `slots` took, in the order the reserve handed them out."""
    pages = []
    for page in (slots // page_size).tolist():
        if page not in pages and page not in prefix_pages:
            pages.append(page)
    return pages


def test_device_last_loc_gives_the_host_paths_slots(daemon):
    with daemon.connect(name="local-gpu") as client, \
            client.reserve(initial_batch=4, max_pages=16) as reserve:
        ps = client.pool.page_size
        prefix = reserve.take(3).tolist()
        prefix_lens = [2, 5, 0]
        seq_lens = [9, 6, 3]
        last = [prefix[0] * ps + 1, prefix[1] * ps + 0, -1]
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            device = reserve.alloc_extend(
                prefix_lens, seq_lens, torch.tensor(last, device="cuda"))
        stream.synchronize()
        slots = device.cpu().numpy()
        assert slots.size == 11
        # The same pages for the host path: put back, first taken on top.
        taken = _new_pages(slots, ps, prefix)
        reserve.put(taken[::-1])
        host = reserve.alloc_extend(prefix_lens, seq_lens, np.array(last))
        assert host.tolist() == slots.tolist()

        # A decode on an explicit stream into a given CUDA buffer.
        out = torch.full((4,), -7, dtype=torch.int64, device="cuda")
        got = reserve.alloc_decode([10], torch.tensor([int(slots[6])],
                                                      device="cuda"),
                                   out=out, stream=stream)
        stream.synchronize()
        assert got.cpu().tolist() == [int(slots[6]) + 1]
        assert out[1:].cpu().tolist() == [-7, -7, -7]
        reserve.take_device_error()  # nothing refused


def test_device_last_loc_past_the_slab_goes_to_page_zero(daemon):
    with daemon.connect(name="local-gpu") as client, \
            client.reserve(initial_batch=4, max_pages=16) as reserve:
        ps = client.pool.page_size
        past = (client.pool.num_pages + 3) * ps + 1
        out = reserve.alloc_decode([3], torch.tensor([past], device="cuda"))
        torch.cuda.synchronize()
        assert out.cpu().tolist() == [0]
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match=r"last_locs\[0\] \(%d\)" % past):
            reserve.take_device_error()
        reserve.take_device_error()  # taken: cleared
