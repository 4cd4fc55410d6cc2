"""python/bench/reserve_alloc_bench.py in a tiny configuration (two
processes, a few steps) against a CPU daemon: it runs and reports every
row, and the reserve's steps make no round trip once it is warm."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "bench"))

import reserve_alloc_bench  # noqa: E402


def test_reserve_bench_reports_every_method(make_daemon, tmp_path):
    daemon = make_daemon("--num_pages=256", "--page_size=4")
    out = tmp_path / "rows.json"
    rows = reserve_alloc_bench.main([
        "--target", daemon.target, "--pages", "4", "--iterations", "50",
        "--processes", "2", "--json", str(out)])
    assert json.loads(out.read_text()) == rows
    assert sorted((row["method"], row["process"]) for row in rows) == [
        (method, process) for method in ("reserve", "slice", "thin")
        for process in (0, 1)]
    for row in rows:
        assert row["p50_us"] > 0 and row["p99_us"] >= row["p50_us"]
        assert row["pages"] == 4 and row["page_size"] == 4
    for row in rows:
        if row["method"] == "reserve":
            # Only the first take, on an empty reserve, refills on the
            # caller's thread (the pool is large enough for both).
            assert row["round_trips_per_step"] <= 1 / 50
            assert row["pages_per_refill"] >= 4
