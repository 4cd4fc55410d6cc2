"""python/bench/engine_loop_bench.py in a tiny configuration against a CPU
daemon: every allocator runs the loop in one and in two scheduler
processes and reports its row; the reserve's row carries its counters and
the thin path's does not."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "bench"))

import engine_loop_bench  # noqa: E402
import pagealloc  # noqa: E402
from conftest import wait_until  # noqa: E402

ALLOCATORS = ("none", "sglang", "pagealloc", "pagealloc-thin")


def test_engine_loop_bench_reports_every_allocator(make_daemon, tmp_path):
    daemon = make_daemon("--semantics=sglang", "--num_pages=2048",
                         "--page_size=16")
    out = tmp_path / "rows.json"
    table = engine_loop_bench.main([
        "--allocators", ",".join(ALLOCATORS), "--target", daemon.target,
        "--processes", "1,2", "--batch", "8", "--max_len", "256",
        "--page_size", "16", "--pool_pages", "2048", "--model_ms", "0.2",
        "--steps", "30", "--warmup", "5", "--timeout_s", "120",
        "--json", str(out)])
    assert json.loads(out.read_text()) == table
    assert [(row["allocator"], row["processes"]) for row in table] == [
        (kind, processes) for processes in (1, 2) for kind in ALLOCATORS]
    for row in table:
        assert row["device"] == "cpu" and row["page_size"] == 16
        assert len(row["per_process"]) == row["processes"]
        assert 0 < row["step_ms_p50"] <= row["step_ms_p99"]
        if row["allocator"] == "none":
            assert row["alloc_us_p99"] == 0
            assert row["over_none_us"] == 0
        else:
            # Most steps start no page; some do, and admissions allocate.
            assert row["alloc_us_p99"] > 0
            assert "over_none_us" in row
        # The reserve's counters come with its rows only.
        assert ("round_trips_per_step" in row) == (
            row["allocator"] == "pagealloc")
    # Every scheduler's session ended with its process: the daemon's pool
    # is whole again.
    with pagealloc.Client.connect(daemon.target) as client:
        wait_until(lambda: client.stats().used_pages == 0,
                   what="the schedulers' pages to come back")


def test_engine_loop_bench_rounds_take_turns(make_daemon, capsys):
    """--rounds: the allocators run in turn, each round's cost over its own
    `none`, and the medians' table names every allocator once."""
    daemon = make_daemon("--semantics=sglang", "--num_pages=1024",
                         "--page_size=16")
    table = engine_loop_bench.main([
        "--allocators", "none,pagealloc", "--target", daemon.target,
        "--processes", "1", "--batch", "4", "--max_len", "256",
        "--page_size", "16", "--pool_pages", "1024", "--model_ms", "0.1",
        "--steps", "10", "--warmup", "2", "--rounds", "2",
        "--timeout_s", "120"])
    assert [(row["round"], row["allocator"]) for row in table] == [
        (0, "none"), (0, "pagealloc"), (1, "none"), (1, "pagealloc")]
    for first, second in ((table[0], table[1]), (table[2], table[3])):
        assert second["over_none_us"] == (
            second["step_ms_p50"] - first["step_ms_p50"]) * 1e3
    out = capsys.readouterr().out
    medians = out[out.index("rounds | step p50 ms, median"):]
    assert medians.count("| none | 1 |") == 1
    assert medians.count("| pagealloc | 1 |") == 1
