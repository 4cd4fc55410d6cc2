#!/usr/bin/env bash
# The test suite: ./bazelw test, then how many test cases passed, failed
# and skipped (cached results counted), and every skipped case with its
# reason (the GPU tests, where no GPU is).
#
#   tools/test.sh                      ./bazelw test //...
#   tools/test.sh --config=asan //...  any arguments of `bazel test`
#                                      (options as --name=value; without a
#                                      target, //...)
#   tools/test.sh --output_base=DIR ...   Bazel's startup options first
#   tools/test.sh --label=L --append=FILE --skip-log=FILE2 ...
#                                      the summary's label, its counts
#                                      appended to FILE and its skipped
#                                      cases to FILE2 (.ci/run)
#   The eight test targets that ran longest are listed after the summary.
#
# Exits with ./bazelw's status.
set -uo pipefail
cd "$(dirname "$0")/.."
startup=()
summary=(--label=suite --slowest=8)
while (($#)); do
  case "$1" in
    --output_base=*) startup+=("$1") ;;
    --label=* | --append=* | --skip-log=*) summary+=("$1") ;;
    *) break ;;
  esac
  shift
done
# No target among the arguments (options are --name=value): //...
targets=0
for arg in "$@"; do
  [[ "$arg" == -* ]] || targets=1
done
((targets)) || set -- "$@" //...
events="$(mktemp "${TMPDIR:-/tmp}/pagealloc-test-events.XXXXXX")"
rc=0
./bazelw "${startup[@]}" test --build_event_json_file="$events" "$@" || rc=$?
python3 tools/test_summary.py "${summary[@]}" --skips --events "$events" ||
  rc=1
rm -f "$events"
exit "$rc"
