"""python/bench/local_expansion_bench.py in a tiny configuration against a
CPU daemon: it runs, reports every row, and the in-process calls make no
round trip once the reserve is warm."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "bench"))

import local_expansion_bench  # noqa: E402


def test_local_expansion_bench_reports_every_row(make_daemon, tmp_path):
    daemon = make_daemon("--num_pages=512", "--page_size=16")
    out = tmp_path / "rows.json"
    rows = local_expansion_bench.main([
        "--target", daemon.target, "--decode_requests", "16",
        "--extend_requests", "2", "--extend_tokens", "40",
        "--iterations", "30", "--json", str(out)])
    assert json.loads(out.read_text()) == rows
    assert sorted((row["method"], row["call"]) for row in rows) == [
        (method, call) for method in ("in-process", "thin")
        for call in ("decode(16)", "extend(2x40)")]
    for row in rows:
        assert row["gpu_work"] == "none" and row["backend"] == "cpu"
        assert row["p50_us"] > 0 and row["p99_us"] >= row["p50_us"]
        # The reserve refilled on the caller's thread at most at its first
        # takes (the pool is large enough).
        assert row["reserve_sync_refills"] <= 2
