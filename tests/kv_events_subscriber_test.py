"""KV events end to end: the publisher (driven through its sink by
tests/kv_events_driver) on ipc:// sockets in a temporary directory, and a
subscriber with python3-zmq and python3-msgpack that decodes the way vLLM's
consumers do (vllm/distributed/kv_events.py's structs, as msgspec decodes
them: a batch [ts, events, data_parallel_rank]; each event a map tagged
under "type", or a tagged array whose fields follow the struct's order).
"""

import os
import shutil
import subprocess
import tempfile

import msgpack
import pytest
import zmq

DRIVER = os.environ["KV_EVENTS_DRIVER"]
END_OF_REPLAY = -1
# Every wait is bounded; none is a measure of speed.
RECEIVE_TIMEOUT_MS = 60000

# vLLM's event structs: (field, required) in declaration order. Fields with
# defaults may be absent (msgspec's omit_defaults).
FIELDS = {
    "BlockStored": [("block_hashes", True), ("parent_block_hash", True),
                    ("token_ids", True), ("block_size", True),
                    ("lora_id", True), ("medium", True), ("lora_name", True),
                    ("extra_keys", False), ("group_idx", False),
                    ("kv_cache_spec_kind", False),
                    ("kv_cache_spec_sliding_window", False)],
    "BlockRemoved": [("block_hashes", True), ("medium", True),
                     ("group_idx", False)],
    "AllBlocksCleared": [],
}


def decode_event(raw):
    """One event -> {"type": tag, field: value...}, as msgspec does."""
    if isinstance(raw, dict):
        tag = raw["type"]
        values = {k: v for k, v in raw.items() if k != "type"}
    else:
        assert isinstance(raw, list) and raw, raw
        tag = raw[0]
        names = [name for name, _ in FIELDS[tag]]
        assert len(raw) - 1 <= len(names), raw
        values = dict(zip(names, raw[1:]))
    assert tag in FIELDS, tag
    event = {"type": tag}
    for name, required in FIELDS[tag]:
        if required:
            assert name in values, (tag, name, raw)
        event[name] = values.get(name)
    if tag != "AllBlocksCleared":
        assert all(isinstance(h, (int, bytes)) for h in event["block_hashes"])
    if tag == "BlockStored":
        assert isinstance(event["block_size"], int)
        assert all(isinstance(t, int) for t in event["token_ids"])
        assert event["parent_block_hash"] is None or isinstance(
            event["parent_block_hash"], (int, bytes))
    return event


def decode_batch(payload):
    batch = msgpack.unpackb(payload, raw=False)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, dp_rank = batch
    assert isinstance(ts, float) and ts > 0
    assert dp_rank == 0
    return [decode_event(e) for e in events]


def stored(keys, parent, block_size, lora=None):
    return {"type": "BlockStored", "block_hashes": keys,
            "parent_block_hash": parent,
            "token_ids": [k * 1000 + i for k in keys
                          for i in range(block_size)],
            "block_size": block_size, "lora_id": lora, "medium": "GPU",
            "lora_name": None, "extra_keys": None, "group_idx": None,
            "kv_cache_spec_kind": None, "kv_cache_spec_sliding_window": None}


def removed(keys):
    return {"type": "BlockRemoved", "block_hashes": keys, "medium": "GPU",
            "group_idx": None}


CLEARED = {"type": "AllBlocksCleared"}


class Driver:
    """tests/kv_events_driver on ipc:// sockets of a temporary directory."""

    def __init__(self, *args):
        self.dir = tempfile.mkdtemp(prefix="kv-events-", dir="/tmp")
        self.process = subprocess.Popen(
            [DRIVER, "endpoint=ipc://%s/pub" % self.dir,
             "replay_endpoint=ipc://%s/replay" % self.dir] + list(args),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        words = self.process.stdout.readline().split()
        assert words and words[0] == "ready", words
        self.pub, self.replay = words[1], words[2]

    def call(self, line):
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        assert answer, "the driver exited at: " + line
        return answer

    def stats(self):
        return dict(w.split("=") for w in self.call("stats").split())

    def close(self):
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def first_answer(ctx, endpoint, request):
    """A replay request from a REQ socket, which takes one answer per
    request: the first, as (sequence, events), or None for the end marker."""
    req = ctx.socket(zmq.REQ)
    req.connect(endpoint)
    req.send(request)
    assert req.poll(RECEIVE_TIMEOUT_MS), "no replay answer"
    seq_bytes, payload = req.recv_multipart()
    req.close(linger=0)
    if int.from_bytes(seq_bytes, "big", signed=True) == END_OF_REPLAY:
        assert payload == b""
        return None
    return int.from_bytes(seq_bytes, "big"), decode_batch(payload)


def replay_all(ctx, endpoint, start):
    """vLLM's replay request from a DEALER socket, which reads every
    answer: [(sequence, events)] up to the end marker."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    answers = []
    while True:
        assert dealer.poll(RECEIVE_TIMEOUT_MS), "no replay answer"
        empty, seq_bytes, payload = dealer.recv_multipart()
        assert empty == b""
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        if seq == END_OF_REPLAY:
            assert payload == b""
            break
        answers.append((seq, decode_batch(payload)))
    dealer.close(linger=0)
    return answers


def events_of(batches):
    return [e for _, events in batches for e in events]


def test_live_batches_decode_in_order_with_no_gap(context):
    driver = Driver()
    try:
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(driver.pub)
        # A SUB socket's subscription reaches the publisher some time after
        # connect: send probes until one arrives, then everything after it
        # must arrive live, in order.
        live = []
        for probe in range(1000):
            driver.call("store %d - 2 -" % (9000 + probe))
            driver.call("flush")
            if sub.poll(50):
                break
        else:
            pytest.fail("the subscription never reached the publisher")
        while sub.poll(0):
            topic, seq_bytes, payload = sub.recv_multipart()
            live.append((int.from_bytes(seq_bytes, "big"), payload))
        expected = [stored([1, 2], None, 4), stored([3], 2, 4, lora=7),
                    removed([1]), CLEARED, stored([2 ** 64 - 2], None, 0)]
        driver.call("store 1,2 - 4 -")
        driver.call("store 3 2 4 7")
        driver.call("remove 1")
        driver.call("clear")
        # Key -2: its last 8 bytes are vLLM's hash 2**64 - 2 (no tokens).
        driver.call("store -2 - 0 -")
        driver.call("flush")
        decoded = []
        while len(decoded) < len(expected):
            assert sub.poll(RECEIVE_TIMEOUT_MS), "a live batch is missing"
            topic, seq_bytes, payload = sub.recv_multipart()
            assert topic == b""
            seq = int.from_bytes(seq_bytes, "big")
            assert seq == live[-1][0] + 1, "a gap after %d: %d" % (
                live[-1][0], seq)
            live.append((seq, payload))
            decoded.extend(decode_batch(payload))
        assert decoded == expected
        # The window holds it all, from sequence 0: AllBlocksCleared first.
        history = replay_all(context, driver.replay, 0)
        seqs = [seq for seq, _ in history]
        assert seqs == list(range(len(history)))
        assert history[0][1][0] == CLEARED
        assert events_of(history)[-len(expected):] == expected
        sub.close(linger=0)
    finally:
        driver.close()


def test_tagged_arrays_decode_by_position(context):
    driver = Driver("encoding=array")
    try:
        driver.call("store 5,6 4 2 -")
        driver.call("remove 5,6")
        driver.call("flush")
        history = replay_all(context, driver.replay, 0)
        assert events_of(history) == [CLEARED, stored([5, 6], 4, 2),
                                      removed([5, 6])]
    finally:
        driver.close()


def test_late_subscriber_replays_from_a_sequence_number(context):
    driver = Driver("replay_batches=4")
    try:
        driver.call("flush")  # batch 0: AllBlocksCleared alone
        for k in range(1, 7):  # batches 1..6, one store each
            driver.call("store %d - 1 -" % k)
            driver.call("flush")
        history = replay_all(context, driver.replay, 4)
        assert [seq for seq, _ in history] == [4, 5, 6]
        assert events_of(history) == [stored([k], None, 1) for k in (4, 5, 6)]
        # The window keeps the last 4 batches: from 0 replays 3..6.
        assert [seq for seq, _ in replay_all(context, driver.replay, 0)] == [
            3, 4, 5, 6]
        # Past the end: the end marker alone.
        assert replay_all(context, driver.replay, 100) == []
        # A REQ socket takes the first answer.
        assert first_answer(context, driver.replay,
                            (5).to_bytes(8, "big")) == (
                                5, [stored([5], None, 1)])
        # A malformed request (7 bytes) gets the end marker alone.
        assert first_answer(context, driver.replay, b"\x00" * 7) is None
        stats = driver.stats()
        assert stats["replay_requests_rejected"] == "1"
        assert stats["oldest_sequence"] == "3"
    finally:
        driver.close()


def test_a_full_queue_drops_and_the_sequence_numbers_show_the_gap(context):
    # Not started: the queue (4 events, AllBlocksCleared the first) fills.
    driver = Driver("queue_events=4", "start=0")
    try:
        for k in range(1, 6):
            driver.call("store %d - 1 -" % k)
        driver.call("start")
        driver.call("flush")
        driver.call("store 6 - 1 -")
        driver.call("flush")
        history = replay_all(context, driver.replay, 0)
        assert [seq for seq, _ in history] == [0, 2]
        assert history[0][1] == [CLEARED] + [stored([k], None, 1)
                                             for k in (1, 2, 3)]
        assert history[1][1] == [stored([6], None, 1)]
        stats = driver.stats()
        assert stats["events_dropped"] == "2"
        assert stats["sequence_gaps"] == "1"
        assert stats["events_published"] == "5"
    finally:
        driver.close()
