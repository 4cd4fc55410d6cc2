"""python/bench/multi_replica_bench.py in a tiny configuration against a
CPU daemon: every set-up, with one and two replicas, generates exactly the
tokens of the single-process reference (the same greedy outputs with and
without the daemon, with and without its prefix cache), and only the
prefix set-up hits the cache."""

import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "bench"))

import multi_replica_bench  # noqa: E402
from conftest import wait_until  # noqa: E402
import pagealloc  # noqa: E402

TINY = ["--layers", "2", "--hidden", "32", "--heads", "4", "--kv_heads",
        "2", "--head_dim", "8", "--vocab", "64", "--max_len", "64",
        "--kv_dtype", "fp32", "--page_size", "4", "--num_pages", "96",
        "--requests", "10", "--system_prompts", "2", "--system_tokens", "13",
        "--suffix_tokens", "2", "6", "--new_tokens", "5",
        "--prefill_chunk", "8", "--max_running", "4", "--device", "cpu"]


def test_every_setup_generates_the_references_tokens(make_daemon):
    args = multi_replica_bench.parser().parse_args(TINY)
    daemon = make_daemon(*multi_replica_bench.daemon_flags(args))
    table = multi_replica_bench.main(
        TINY + ["--target", daemon.target, "--replicas", "1,2", "--check",
                "--timeout_s", "120"])
    assert [(r["setup"], r["replicas"]) for r in table] == [
        (setup, n) for n in (1, 2) for setup in multi_replica_bench.SETUPS]
    for row in table:
        assert row["requests"] == 10, row["setup"]
        assert row["mismatches"] == [], (row["setup"], row["replicas"])
        assert row["tokens_per_s"] > 0
        assert 1 <= row["peak_sequences_min"] <= row["peak_sequences_max"]
        if row["setup"] == "shared-prefix":
            # Five requests a system prompt: the later ones find its pages
            # (each run starts from an empty cache, so not all of them).
            assert 0 < row["prefix_hit_rate"] < 1
            assert row["kv_reused_mib"] > 0
        else:
            assert row["prefix_hit_rate"] == 0
            assert row["kv_reused_mib"] == 0
    # Every replica's session ended with its process: nothing is owned; the
    # published system prompts stay cached until an operator's reset.
    with pagealloc.Client.connect(daemon.target) as client:
        wait_until(lambda: client.stats().used_pages == 0,
                   what="the replicas' pages to come back")
        assert client.stats().prefix_published_pages == 0
    assert pagealloc.reset_prefix_cache(daemon.target) > 0


def test_requests_arriving_over_time_hit_what_earlier_ones_published(
        make_daemon):
    # A Poisson stream: the later requests of a system prompt arrive after
    # its first one was prefilled and published, so they find its pages;
    # the tokens are the reference's all the same.
    args = multi_replica_bench.parser().parse_args(TINY)
    daemon = make_daemon(*multi_replica_bench.daemon_flags(args))
    table = multi_replica_bench.main(
        TINY + ["--target", daemon.target, "--replicas", "1", "--check",
                "--setups", "shared-prefix", "--arrival_rate", "50",
                "--timeout_s", "120"])
    (row,) = table
    assert row["requests"] == 10 and row["mismatches"] == []
    assert row["prefix_hit_rate"] > 0
    assert row["ttft_ms_p50"] > 0


def test_plot_from_an_earlier_runs_rows(tmp_path):
    # --plot_from draws a --json file's rows (gnuplot, where installed)
    # without running anything.
    rows = [dict(setup=setup, replicas=n, tokens_per_s=100.0 * n + i,
                 peak_sequences_max=10 + n) for n in (1, 2)
            for i, setup in enumerate(multi_replica_bench.SETUPS)]
    source = tmp_path / "rows.json"
    source.write_text(json.dumps(rows))
    out = tmp_path / "plot.svg"
    table = multi_replica_bench.main(["--plot_from", str(source), "--plot",
                                      str(out)])
    assert table == rows
    if shutil.which("gnuplot"):
        text = out.read_text()
        assert "<svg" in text and "shared-prefix" in text
    else:
        assert not out.exists()
