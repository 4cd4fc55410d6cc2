"""The daemon's KV slab through the Python package, against real daemons.

Each daemon owns its KV memory (--kv_layout); every session maps the same
slab, so bytes one session writes at its slots are the bytes another reads
there. On the CPU backend the views are NumPy arrays over the mapping; on
the CUDA backend (PAGEALLOC_TEST_BACKEND=cuda) torch tensors and CuPy
arrays over the device mapping.
"""

import gc
import weakref

import numpy as np
import pytest

import pagealloc
from conftest import BACKEND

ON_GPU = BACKEND == "cuda"
try:
    import torch
except ImportError:
    torch = None

# 16 pages of 4 slots, page 0 included: 68 slots per buffer.
NUM_SLOTS = (16 + 1) * 4
LAYOUT = "custom:layers=2,k=bf16:2x4,v=fp32:3,q=fp8_e4m3:5,s=int8:2x3"


@pytest.fixture
def kv_daemon(make_daemon):
    return make_daemon("--num_pages=16", "--page_size=4",
                       "--kv_layout=" + LAYOUT)


def host_slots(allocation):
    slots = allocation.slots
    if isinstance(slots, pagealloc.CudaSlots):
        return slots.copy_to_host()
    return np.asarray(slots)


def test_buffers_follow_the_layout(kv_daemon):
    with kv_daemon.connect() as client:
        buffers = client.kv_buffers()
        assert [b.name for b in buffers] == [
            "k.0", "v.0", "q.0", "s.0", "k.1", "v.1", "q.1", "s.1"]
        expected = {
            "k": ("bf16", (2, 4), 2, "<u2"),
            "v": ("fp32", (3,), 4, "<f4"),
            "q": ("fp8_e4m3", (5,), 1, "|u1"),
            "s": ("int8", (2, 3), 1, "|i1"),
        }
        for b in buffers:
            dtype, element, itemsize, typestr = expected[b.name.split(".")[0]]
            assert b.dtype == dtype
            assert b.element_shape == element
            assert b.shape == (NUM_SLOTS,) + element
            assert b.num_slots == len(b) == NUM_SLOTS
            assert b.itemsize == itemsize
            assert b.stride_bytes == itemsize * int(np.prod(element))
            assert b.nbytes == NUM_SLOTS * b.stride_bytes
            assert b.typestr == typestr
            assert b.strides is None           # contiguous, slot-major
            assert b.pointer != 0
            assert b.on_device == ON_GPU
            assert b.device == (client.pool.gpu if ON_GPU else -1)
            assert b.slot_address(3) == b.pointer + 3 * b.stride_bytes
            assert "name=%r" % b.name in repr(b)
        # Buffers do not overlap.
        spans = sorted((b.pointer, b.pointer + b.nbytes) for b in buffers)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start
        assert client.kv_buffer("v.1").pointer == buffers[5].pointer
        with pytest.raises(KeyError, match="k.2"):
            client.kv_buffer("k.2")
        with pytest.raises(IndexError):
            buffers[0].slot_address(NUM_SLOTS)


def test_mha_layout_gives_k_and_v_per_layer(make_daemon):
    daemon = make_daemon("--num_pages=16", "--page_size=4",
                         "--kv_layout=mha:layers=2,kv_heads=2,head_dim=8,"
                         "dtype=fp16")
    with daemon.connect() as client:
        buffers = client.kv_buffers()
        assert [b.name for b in buffers] == ["k.0", "v.0", "k.1", "v.1"]
        for b in buffers:
            assert b.dtype == "fp16" and b.shape == (NUM_SLOTS, 2, 8)
            assert b.stride_bytes == 2 * 8 * 2
            if not ON_GPU:
                array = np.asarray(b)
                assert array.dtype == np.float16
                assert array.shape == b.shape
                assert array.strides == (32, 16, 2)


def test_no_buffers_without_a_kv_layout_or_when_not_mapped(daemon, kv_daemon):
    with daemon.connect() as client:
        assert client.kv_buffers() == []
        with pytest.raises(KeyError, match="none"):
            client.kv_buffer("k.0")
    with kv_daemon.connect(map_kv_slab=False) as client:
        assert client.kv_buffers() == []
        # The session itself serves allocations as usual.
        assert client.alloc([4]).check().num_slots == 4


@pytest.mark.skipif(ON_GPU, reason="NumPy views: CPU backend only")
def test_numpy_views_alias_the_slab(kv_daemon):
    with kv_daemon.connect() as client:
        for b in client.kv_buffers():
            array = np.asarray(b)
            assert array.__array_interface__["data"][0] == b.pointer
            assert array.shape == b.shape
            assert array.strides[0] == b.stride_bytes
            assert array.flags.writeable
            # bf16 and fp8 have no NumPy dtype: their raw bits.
            assert array.dtype == {"bf16": np.uint16, "fp32": np.float32,
                                   "fp8_e4m3": np.uint8,
                                   "int8": np.int8}[b.dtype]
            assert np.shares_memory(array, np.asarray(b))
        k0 = client.kv_buffer("k.0")
        assert not hasattr(k0, "__cuda_array_interface__")


@pytest.mark.skipif(ON_GPU, reason="NumPy views: CPU backend only")
def test_bytes_written_by_one_session_are_read_by_another(kv_daemon):
    with kv_daemon.connect(name="writer") as writer, \
            kv_daemon.connect(name="reader") as reader:
        slots = host_slots(writer.alloc([8]).check())     # pages 1, 2
        assert slots.tolist() == list(range(4, 12))
        rng = np.random.default_rng(16)
        for name in ("k.1", "v.0", "q.1", "s.0"):
            mine = np.asarray(writer.kv_buffer(name))
            theirs = np.asarray(reader.kv_buffer(name))
            # Two mappings of one slab, not one mapping seen twice.
            assert (mine.__array_interface__["data"][0] !=
                    theirs.__array_interface__["data"][0])
            assert not np.shares_memory(mine, theirs)
            raw = rng.integers(0, 256, size=(len(slots), mine[0].nbytes),
                               dtype=np.uint8)
            mine[slots] = raw.view(mine.dtype).reshape(
                (len(slots),) + mine.shape[1:])
            assert theirs[slots].tobytes() == raw.tobytes()
            # Slots outside the allocation are untouched (a new memfd
            # reads zero).
            assert not theirs[12:].any()


def test_views_keep_the_client_alive(kv_daemon):
    client = kv_daemon.connect()
    alive = weakref.ref(client)
    buffer = client.kv_buffer("v.0")
    if ON_GPU:
        assert torch is not None, "the GPU check needs torch"
        view = buffer.as_torch()
        values = torch.tensor([1.0, 2.0, 3.0], device=view.device)
    else:
        view = np.asarray(buffer)
        values = [1.0, 2.0, 3.0]
    del client, buffer
    gc.collect()
    assert alive() is not None            # the view holds the client
    view[4] = values                      # the mapping is still there
    assert view[4].tolist() == [1.0, 2.0, 3.0]
    del view
    gc.collect()
    assert alive() is None


@pytest.mark.skipif(torch is None, reason="torch is not installed here: "
                    "KvBuffer.as_torch is checked where it is")
def test_as_torch_gives_the_real_dtypes(kv_daemon):
    with kv_daemon.connect(name="writer") as writer, \
            kv_daemon.connect(name="reader") as reader:
        slots = host_slots(writer.alloc([4]).check())
        k = writer.kv_buffer("k.0").as_torch()
        assert k.dtype == torch.bfloat16
        assert tuple(k.shape) == (NUM_SLOTS, 2, 4)
        assert k.data_ptr() == writer.kv_buffer("k.0").pointer
        assert k.is_cuda == ON_GPU
        if hasattr(torch, "float8_e4m3fn"):
            assert writer.kv_buffer("q.0").as_torch().dtype == \
                torch.float8_e4m3fn
        assert writer.kv_buffer("v.0").as_torch().dtype == torch.float32
        assert writer.kv_buffer("s.0").as_torch().dtype == torch.int8
        index = torch.as_tensor(slots, device=k.device)
        values = torch.arange(len(slots) * 8, dtype=torch.float32,
                              device=k.device).reshape(len(slots), 2, 4)
        k[index] = values.to(torch.bfloat16)
        if ON_GPU:
            torch.cuda.synchronize()
        theirs = reader.kv_buffer("k.0").as_torch()
        assert torch.equal(theirs[index].float(), values)


@pytest.mark.skipif(not ON_GPU, reason="CUDA backend only "
                    "(PAGEALLOC_TEST_BACKEND=cuda on a GPU host)")
def test_cuda_views_are_zero_copy(kv_daemon):
    assert torch is not None, "the GPU check needs torch"
    with kv_daemon.connect() as client:
        v = client.kv_buffer("v.0")
        interface = v.__cuda_array_interface__
        assert interface["version"] == 3 and interface["stream"] is None
        assert interface["data"] == (v.pointer, False)
        assert not hasattr(v, "__array_interface__")
        tensor = torch.as_tensor(v, device="cuda")
        assert tensor.data_ptr() == v.pointer
        assert tensor.dtype == torch.float32
        assert tuple(tensor.shape) == v.shape
        cupy = pytest.importorskip("cupy")
        array = cupy.asarray(client.kv_buffer("k.1"))
        assert array.dtype == cupy.uint16
        assert array.data.ptr == client.kv_buffer("k.1").pointer
