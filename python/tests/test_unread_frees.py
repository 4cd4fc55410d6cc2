"""The token allocator's queue of frees on their way to the host
(pagealloc/_unread_frees.py): the pinned ring's regions, the events shared
by runs of copies, and frees read together in one call to the reserve. The
CUDA copies themselves are test_sglang_gpu.py's."""

import random

import numpy as np
import pytest

import pagealloc
from pagealloc._unread_frees import RingSpace, RunMarks

from test_sglang import host, pytestmark  # noqa: F401
from test_sglang_reserve import lone


def test_ring_regions_never_overlap_a_live_one():
    """Random places, releases and cancels against a list of the live
    regions: every region lies in the ring and overlaps no live one,
    releases go oldest first, cancels newest first, and a refusal leaves no
    gap of that size at the tail or at the front that the rule may use."""
    rng = random.Random(7)
    capacity = 64
    for _ in range(200):
        space = RingSpace(capacity)
        live = []
        for _ in range(300):
            roll = rng.random()
            if live and roll < 0.45:
                space.release()
                live.pop(0)
                continue
            if live and roll < 0.55:
                space.cancel()  # a copy that failed to queue
                live.pop()
                continue
            count = rng.randint(1, capacity // 2)
            start = space.place(count)
            if start is None:
                assert live, "an empty ring refused %d slots" % count
                oldest = live[0][0]
                tail = live[-1][1]
                if tail >= oldest:
                    assert tail + count > capacity and count >= oldest
                else:
                    assert tail + count >= oldest
                continue
            end = start + count
            assert 0 <= start and end <= capacity
            for a, b in live:
                assert end <= a or start >= b, (start, end, live)
            live.append((start, end))
            assert len(space) == len(live)


def test_an_empty_ring_takes_its_whole_capacity_once():
    space = RingSpace(16)
    assert space.place(17) is None
    assert space.place(16) == 0
    assert space.place(1) is None
    space.release()
    assert space.place(4) == 0
    assert space.place(4) == 4


class Stream:
    """A stream as the events see it: work queued on it, and how much of
    that the GPU has done (moved on by the test)."""

    def __init__(self):
        self.queued = 0
        self.done = 0


class Event:
    """An event on a Stream: passed once the stream has done the work
    queued before its record. Records itself in `log` to catch an event
    recorded again while a run still counts on it."""

    def __init__(self, log):
        self.log = log
        self.stream = None
        self.at = 0

    def record(self, stream):
        self.log.append(self)
        self.stream, self.at = stream, stream.queued

    def query(self):
        return self.stream.done >= self.at

    def synchronize(self):
        self.stream.done = max(self.stream.done, self.at)


def test_a_run_passes_only_once_each_of_its_copies_has_run():
    """Copies on three streams in random order, the streams moving on at
    random, reads oldest first with and without waiting, against a list of
    where each copy sits on its stream: a mark that passed is past every
    copy of its run, a wait always passes, an event recorded again serves
    no run still waiting, and a run holds at most run_length copies."""
    rng = random.Random(11)
    for _ in range(100):
        recorded = []
        marks = RunMarks(lambda: Event(recorded), run_length=4)
        streams = [Stream() for _ in range(3)]
        stream = streams[0]
        queued = []  # (mark, stream, position), oldest first
        for _ in range(200):
            roll = rng.random()
            if roll < 0.1:
                stream = rng.choice(streams)
            elif roll < 0.6:
                stream.queued += rng.randint(1, 3)  # a forward, say
                stream.queued += 1  # the copy
                mark = marks.mark(stream)
                queued.append((mark, stream, stream.queued))
                run = [q for q in queued if q[0] is mark]
                assert len(run) <= 4
                assert all(q[1] is stream for q in run)
            elif roll < 0.8:
                chosen = rng.choice(streams)
                chosen.done = rng.randint(chosen.done, chosen.queued)
            elif queued:
                wait = rng.random() < 0.3
                while queued:
                    mark, on, position = queued[0]
                    if not marks.passed(mark, wait):
                        assert not wait
                        break
                    assert on.done >= position
                    queued.pop(0)
                    marks.give_back(mark)
            # An event serves one run until that run has passed.
            runs_of_event = {}
            for mark, _, _ in queued:
                if mark.event is not None and not mark.passed:
                    runs_of_event.setdefault(id(mark.event), set()).add(
                        id(mark))
            assert all(len(runs) == 1 for runs in runs_of_event.values())


def test_copies_in_a_row_on_one_stream_share_one_event():
    recorded = []
    marks = RunMarks(lambda: Event(recorded), run_length=8)
    stream, other = Stream(), Stream()

    def copy(on):
        on.queued += 1
        return marks.mark(on)

    runs = [copy(stream) for _ in range(20)]
    assert len(recorded) == 2  # two full runs; the third still open
    assert runs[0] is runs[7] and runs[8] is runs[15]
    assert runs[16] is runs[19] and runs[16].event is None
    copy(other)  # a copy on another stream closes the open run
    assert len(recorded) == 3 and recorded[2].stream is stream
    assert not marks.passed(runs[16], wait=False)
    assert marks.passed(runs[16], wait=True)
    assert stream.done >= recorded[2].at


def queue(allocator, values):
    """A free queued as a CUDA tensor's is, not read yet (a CPU tensor's
    free is read at once by free() itself)."""
    return allocator._unread.add(values)


def test_landed_frees_are_read_in_one_call_in_the_order_freed(make_daemon):
    """Several frees queued, then read by one free: the slots come back at
    the free list's end in the order freed, through one put_under."""
    torch = pytest.importorskip("torch")
    with lone(make_daemon, 1, 64, device="cpu") as allocator:
        first = torch.as_tensor(host(allocator.alloc(12)))
        calls = []
        reserve = allocator._reserve
        real = reserve.put_under

        def counted(pages, stream=None):
            calls.append(np.array(pages))
            return real(pages, stream)

        reserve.put_under = counted
        queue(allocator, first[[3, 1]])
        queue(allocator, first[[7]].to(torch.int32))
        queue(allocator, first[[0, 2]])
        assert allocator.available_size() == 52 + 5
        allocator.free(first[[11]])  # reads all four
        assert len(calls) == 1
        np.testing.assert_array_equal(calls[0], [4, 2, 8, 1, 3, 12])
        rest = host(allocator.alloc(58))
        np.testing.assert_array_equal(
            rest, np.concatenate((np.arange(13, 65), [4, 2, 8, 1, 3, 12])))


def test_a_bad_free_among_landed_ones_is_named_and_the_rest_stay(
        make_daemon):
    """A joined read the reserve refuses goes one free at a time: those
    before the bad one are freed, the bad one raises as an earlier free
    and frees nothing, those after it stay queued for the next read."""
    torch = pytest.importorskip("torch")
    with lone(make_daemon, 1, 64, device="cpu") as allocator:
        first = torch.as_tensor(host(allocator.alloc(8)))
        queue(allocator, first[[0]])          # slot 1
        queue(allocator, first[[1, 1]])       # slot 2 twice
        queue(allocator, first[[2, 3]])       # slots 3, 4
        with pytest.raises(pagealloc.InvalidArgumentError,
                           match="earlier free of 2 CUDA slots.*twice"):
            allocator.free(first[[4]])        # slot 5
        # Slot 1 freed, slot 2 not; 3, 4 and 5 queued still.
        assert allocator.available_size() == 56 + 1 + 3
        allocator.free(first[[5]])            # reads 3, 4, 5 and 6
        allocator.free(first[[1]])            # slot 2, once
        rest = host(allocator.alloc(56 + 6))
        np.testing.assert_array_equal(
            rest, np.concatenate((np.arange(9, 65), [1, 3, 4, 5, 6, 2])))
