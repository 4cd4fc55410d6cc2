#!/bin/bash
# Runs tests/kv_events_subscriber_test.py with Debian's interpreter (and its
# python3-zmq and python3-msgpack) against the driver Bazel built.
set -euo pipefail
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export KV_EVENTS_DRIVER="$runfiles/tests/kv_events_driver"
export PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 -m pytest -p no:cacheprovider -rs -v \
  ${XML_OUTPUT_FILE:+--junitxml="$XML_OUTPUT_FILE"} \
  --rootdir="$runfiles/tests" "$runfiles/tests/kv_events_subscriber_test.py"
