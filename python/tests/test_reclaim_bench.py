"""python/bench/reclaim_bench.py in a tiny configuration against a CPU
daemon: a session starved by another's full reserve gets its pages every
time, because the holder's reserve answers the daemon's ask."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "bench"))

import reclaim_bench  # noqa: E402


def test_a_starved_session_gets_the_holders_pages(make_daemon, tmp_path):
    daemon = make_daemon("--num_pages=64", "--page_size=4")
    out = tmp_path / "row.json"
    row = reclaim_bench.main([
        "--target", daemon.target, "--pages", "4", "--iterations", "5",
        "--json", str(out)])
    assert json.loads(out.read_text()) == row
    assert row["pool_pages"] == 64 and row["iterations"] == 5
    # Every wait ended with the pages (the bench returns only then), and
    # each began refused: the holder's reserve had the whole pool.
    assert row["calls_per_wait"] >= 2
    assert row["asks_answered"] == 5
    assert row["pages_returned_per_answer"] >= 4
    assert 0 < row["p50_us"] <= row["p99_us"] <= row["max_us"]
