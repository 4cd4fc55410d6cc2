"""python/bench/engine_loop_bench.py in a tiny configuration against a CPU
daemon: every allocator runs the loop in one and in two scheduler
processes and reports its row; the reserve's row carries its counters and
the thin path's does not."""

import json
import os
import sys

import pytest

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
        # The phases of a step: queueing (the model step's), the GPU wait
        # and retiring.
        assert row["queue_us_p50"] > 0
        assert row["sync_us_p50"] >= 0 and row["retire_us_p50"] >= 0
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


def test_engine_loop_bench_interleaves_the_allocators(make_daemon, capsys):
    """--interleave: each process runs every allocator in blocks, in turn;
    a row's per-cycle costs are its blocks' medians less `none`'s, its
    pairs with SGLang those less SGLang's of the same cycle."""
    daemon = make_daemon("--semantics=sglang", "--num_pages=2048",
                         "--page_size=16")
    table = engine_loop_bench.main([
        "--allocators", "none,sglang,pagealloc", "--target", daemon.target,
        "--processes", "1,2", "--batch", "4", "--max_len", "256",
        "--page_size", "16", "--pool_pages", "2048", "--model_ms", "0.1",
        "--steps", "10", "--warmup", "2", "--interleave", "3",
        "--timeout_s", "120"])
    assert [(row["allocator"], row["processes"]) for row in table] == [
        (kind, processes) for processes in (1, 2)
        for kind in ("none", "sglang", "pagealloc")]
    for none, sglang, paged in (table[0:3], table[3:6]):
        processes = none["processes"]
        # 10 steps in blocks of 3: 4 cycles in each process.
        assert len(none["over_none_us_cycles"]) == 4 * processes
        assert none["over_none_us_cycles"] == [0.0] * (4 * processes)
        assert "vs_sglang_us" not in none
        assert sglang["vs_sglang_us_cycles"] == [0.0] * (4 * processes)
        assert paged["vs_sglang_us_cycles"] == [
            mine - theirs for mine, theirs in zip(
                paged["over_none_us_cycles"],
                sglang["over_none_us_cycles"])]
        assert paged["over_none_us"] == engine_loop_bench.percentile(
            paged["over_none_us_cycles"], 50)
        assert "round_trips_per_step" in paged
        assert "round_trips_per_step" not in sglang
        for row in (none, sglang, paged):
            assert len(row["per_process"]) == processes
            assert 0 < row["step_ms_p50"] <= row["step_ms_p99"]
    out = capsys.readouterr().out
    cycles = out[out.index("over SGLang us, median"):]
    assert cycles.count("| pagealloc | 2 | off | 8 |") == 1
    with pagealloc.Client.connect(daemon.target) as client:
        wait_until(lambda: client.stats().used_pages == 0,
                   what="the schedulers' pages to come back")


def test_engine_loop_bench_interleave_needs_none_first():
    with pytest.raises(SystemExit, match="name it first"):
        engine_loop_bench.main(["--allocators", "sglang,none",
                                "--interleave", "4"])
