#!/bin/bash
# Runs a pytest file of python/tests with Debian's interpreter against the
# library and daemon Bazel built: python_test.sh TEST_FILE [PYTEST_ARGS...]
set -euo pipefail
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PAGEALLOC_LIBRARY="$runfiles/client/libpagealloc_client.so"
export PAGEALLOC_SERVER="$runfiles/server/pagealloc-server"
export PYTHONPATH="$runfiles/python:$runfiles/python/tests"
export PYTHONDONTWRITEBYTECODE=1
# Under --config=asan the library is built with AddressSanitizer and UBSan,
# whose runtimes must come first in a process not built with them (this
# interpreter): preload the ones the library needs (clang's shared runtime,
# or GCC's libasan and libubsan).
preload="$(ldd "$PAGEALLOC_LIBRARY" |
  awk '/lib(asan|ubsan)\.so|libclang_rt\.asan/ {print $3}' | paste -sd: -)"
if [[ -n "$preload" ]]; then
  export LD_PRELOAD="$preload${LD_PRELOAD:+:$LD_PRELOAD}"
  # The interpreter keeps objects to its end on purpose: no leak report.
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fi
test_file="$1"
shift
# -rs lists every skipped test with its reason (the GPU-only ones here);
# the JUnit XML becomes Bazel's test.xml, whose cases and skips
# tools/test_summary.py counts.
exec /usr/bin/python3 -m pytest -p no:cacheprovider -rs -v \
  ${XML_OUTPUT_FILE:+--junitxml="$XML_OUTPUT_FILE"} \
  --rootdir="$runfiles/python" "$runfiles/python/$test_file" "$@"
