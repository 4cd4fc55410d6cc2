"""Hand-checked cases for pagealloc.sglang_model, the NumPy statement of
SGLang's allocators the daemon is compared with."""

import numpy as np
import pytest

from pagealloc.sglang_model import (PagedAllocatorModel, TokenAllocatorModel,
                                    make_allocator_model)


def listed(array):
    return [int(v) for v in array]


def test_golden_vector_extend_fills_the_partial_page_then_new_pages():
    # Page size 4; a prefix of 2 tokens ending at slot 1; free pages 3, 4, ...
    model = PagedAllocatorModel(size=4 * 8, page_size=4)
    model.free_pages = np.arange(3, 9, dtype=np.int64)
    out = model.alloc_extend(prefix_lens=[2], seq_lens=[11], last_loc=[1],
                             extend_num_tokens=9)
    assert listed(out) == [2, 3, 12, 13, 14, 15, 16, 17, 18]
    assert listed(model.free_pages) == [5, 6, 7, 8]


def test_extend_batch_takes_pages_in_request_order():
    model = PagedAllocatorModel(size=32, page_size=4)
    out = model.alloc_extend([0, 0, 4], [5, 4, 6], [-1, -1, 7])
    # Request 0: pages 1, 2 (slots 4..8); request 1: page 3; request 2's
    # prefix of 4 fills its page exactly (last_loc 7), so its 2 tokens
    # start a new page, 4.
    assert listed(out) == [4, 5, 6, 7, 8, 12, 13, 14, 15, 16, 17]
    assert listed(model.free_pages) == [5, 6, 7, 8]


def test_decode_within_a_page_and_across_pages():
    model = PagedAllocatorModel(size=32, page_size=4)
    assert listed(model.alloc(8)) == [4, 5, 6, 7, 8, 9, 10, 11]
    # seq 6 (last token at slot 8): inside page 2; seq 5 after slot 7 and
    # seq 1 (an empty prefix) each start a page.
    out = model.alloc_decode([6, 5, 1], [8, 7, -1])
    assert listed(out) == [9, 12, 16]
    assert listed(model.free_pages) == [5, 6, 7, 8]


def test_a_batch_that_does_not_fit_is_none_and_changes_nothing():
    model = PagedAllocatorModel(size=16, page_size=4)
    assert model.alloc(12) is not None
    before = listed(model.free_pages)
    assert model.alloc_extend([0, 0], [4, 4], [-1, -1]) is None
    assert model.alloc_decode([1, 1], [-1, -1]) is None
    assert model.alloc(8) is None
    assert listed(model.free_pages) == before
    assert model.available_size() == 4


def test_free_puts_distinct_pages_back_ascending_at_the_front():
    model = PagedAllocatorModel(size=32, page_size=4)
    model.alloc(8)  # pages 1, 2
    model.free([8, 9, 10, 11, 4, 5, 6, 7])
    assert listed(model.free_pages[:3]) == [1, 2, 3]
    assert listed(model.alloc(4)) == [4, 5, 6, 7]


def test_free_segment_keeps_the_segments_page_order():
    model = PagedAllocatorModel(size=32, page_size=4)
    model.alloc(12)  # pages 1, 2, 3
    # A row whose pages are 3, 1 (slots 12..15, then 4..5), from position 0.
    model.free_segment([12, 13, 14, 15, 4, 5], start_pos=0)
    assert listed(model.free_pages[:3]) == [3, 1, 4]
    # An unaligned start: the first slot stands for its page, then one per
    # page boundary.
    model = PagedAllocatorModel(size=32, page_size=4)
    model.alloc(12)
    model.free_segment([6, 7, 12, 13, 14, 15, 8], start_pos=2)
    assert listed(model.free_pages[:4]) == [1, 3, 2, 4]


def test_free_group_frees_once_at_its_end():
    model = PagedAllocatorModel(size=32, page_size=4)
    model.alloc(12)
    model.free_group_begin()
    model.free([12, 13])
    model.free([4])
    assert listed(model.free_pages[:1]) == [4]
    model.free_group_end()
    assert listed(model.free_pages[:3]) == [1, 3, 4]


def test_sorted_policy_merges_on_the_extend_over_estimate():
    model = PagedAllocatorModel(size=32, page_size=4, need_sort=True)
    model.alloc(24)  # pages 1..6
    model.free([16, 8])  # pages 4, 2: parked, newest first
    assert listed(model.release_pages) == [2, 4]
    assert listed(model.free_pages) == [7, 8]
    # Needs 1 page of 2, but 4 // 4 + 1 + 1 = 3 > 2: merge first.
    assert listed(model.alloc_extend([0], [4], [-1])) == [8, 9, 10, 11]
    assert listed(model.free_pages) == [4, 7, 8]
    assert listed(model.release_pages) == []


def test_sorted_policy_merges_on_the_decode_batch_size():
    model = PagedAllocatorModel(size=32, page_size=4, need_sort=True)
    model.alloc(24)
    model.free([16, 8])
    # Three decodes, one of which starts a page: 3 > 2 free pages.
    out = model.alloc_decode([2, 2, 1], [4, 12, -1])
    assert listed(out) == [5, 13, 8]
    # An alloc merges only when it does not fit.
    model = PagedAllocatorModel(size=32, page_size=4, need_sort=True)
    model.alloc(24)
    model.free([16, 8])
    assert listed(model.alloc(8)) == [28, 29, 30, 31, 32, 33, 34, 35]
    assert listed(model.release_pages) == [2, 4]


def test_backup_state_restores_twice():
    model = PagedAllocatorModel(size=32, page_size=4, need_sort=True)
    model.alloc(4)
    model.free([4])
    state = model.backup_state()
    saved = (listed(model.free_pages), listed(model.release_pages))
    model.alloc(12)
    model.restore_state(state)
    assert (listed(model.free_pages), listed(model.release_pages)) == saved
    model.alloc_extend([0], [30], [-1])
    model.free([8])
    model.restore_state(state)
    assert (listed(model.free_pages), listed(model.release_pages)) == saved


def test_clear_starts_over():
    model = PagedAllocatorModel(size=16, page_size=4, need_sort=True)
    model.alloc(8)
    model.free([4])
    model.clear()
    assert listed(model.free_pages) == [1, 2, 3, 4]
    assert listed(model.release_pages) == []
    assert model.available_size() == 16


def test_token_allocator_appends_what_it_frees():
    model = make_allocator_model(size=6, page_size=1)
    assert isinstance(model, TokenAllocatorModel)
    assert listed(model.alloc(4)) == [1, 2, 3, 4]
    model.free([3, 1])
    assert listed(model.free_pages) == [5, 6, 3, 1]
    assert listed(model.alloc(3)) == [5, 6, 3]
    assert model.alloc(2) is None
    with pytest.raises(NotImplementedError):
        model.alloc_extend([0], [1], [-1])


def test_token_allocator_sorted_parks_then_merges_when_short():
    model = TokenAllocatorModel(size=4, need_sort=True)
    model.alloc(3)
    model.free([3, 1])
    assert listed(model.release_pages) == [3, 1]
    assert listed(model.alloc(1)) == [4]
    assert listed(model.alloc(2)) == [1, 3]
    assert model.available_size() == 0


def test_random_traces_keep_every_slot_unique_and_accounted():
    rng = np.random.default_rng(7)
    for page_size in (1, 4, 16):
        for need_sort in (False, True):
            model = make_allocator_model(64 * page_size, page_size, need_sort)
            live = []  # (slots, seq_len)
            for _ in range(400):
                op = rng.integers(0, 3)
                if op == 0 or not live:
                    n = int(rng.integers(1, 3 * page_size + 2))
                    if page_size == 1:
                        out = model.alloc(n)
                    else:
                        out = model.alloc_extend([0], [n], [-1])
                    if out is not None:
                        live.append((listed(out), n))
                elif op == 1:
                    k = int(rng.integers(0, len(live)))
                    slots, n = live[k]
                    if page_size == 1:
                        out = model.alloc(1)
                    else:
                        out = model.alloc_decode([n + 1], [slots[-1]])
                    if out is not None:
                        live[k] = (slots + listed(out), n + 1)
                else:
                    k = int(rng.integers(0, len(live)))
                    model.free(live.pop(k)[0])
                held = [s for slots, _ in live for s in slots]
                assert len(held) == len(set(held))
                pages = {s // page_size for s in held}
                free = set(listed(model.free_pages)) | set(
                    listed(model.release_pages))
                assert not pages & free
                assert len(pages) + len(free) == 64


def test_page_aligned_free_puts_whole_pages_back_in_the_order_given():
    m = PagedAllocatorModel(16, 4, page_aligned_free=True)
    out = m.alloc(8)  # pages 1, 2
    with pytest.raises(ValueError, match="complete page blocks"):
        m.free(out[:3])
    m.free_group_begin()
    with pytest.raises(ValueError, match="complete page blocks"):
        m.free(out[:3])
    m.free_group_end()
    assert m.free_pages.tolist() == [3, 4]
    m.free(np.concatenate((out[4:], out[:4])))
    assert m.free_pages.tolist() == [2, 1, 3, 4]


def test_page_aligned_free_with_need_sort_parks_in_order():
    m = PagedAllocatorModel(16, 4, need_sort=True, page_aligned_free=True)
    m.free(m.alloc(8))
    assert m.free_pages.tolist() == [3, 4]
    assert m.release_pages.tolist() == [1, 2]


def test_free_page_ids_frees_pages_by_id():
    m = PagedAllocatorModel(16, 4, page_aligned_free=True)
    m.alloc(16)
    m.free_page_ids([3, 1])
    assert m.free_pages.tolist() == [3, 1]
    token = TokenAllocatorModel(4)
    token.alloc(4)
    token.free_page_ids([2, 4])
    assert token.free_pages.tolist() == [2, 4]
