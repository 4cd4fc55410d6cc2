#!/usr/bin/env bash
# Runs one fuzz target over a copy of its seed corpus for
# $PAGEALLOC_FUZZ_SECONDS (default 25). Built with --config=fuzz this is
# libFuzzer (with AddressSanitizer and UBSan); in the default build the
# target has a replay main() that runs the seeds and a bounded set of
# mutations. A crash, a sanitizer report or an abort fails the test.
set -euo pipefail
binary=$1
seeds=$2
work=${TEST_TMPDIR:-/tmp}/corpus.$(basename "$binary")
mkdir -p "$work"
cp "$seeds"/* "$work"/
exec "$binary" -max_total_time="${PAGEALLOC_FUZZ_SECONDS:-25}" \
  -print_final_stats=1 -timeout=10 -rss_limit_mb=4096 "$work"
