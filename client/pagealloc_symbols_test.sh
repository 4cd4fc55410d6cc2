#!/bin/bash
# libpagealloc_client.so exports exactly the functions pagealloc.h declares:
# nothing else (our C++ code and the generated protobuf code stay inside),
# and none of the header's missing.
set -euo pipefail
library="$1"
header="$2"
exported="$(nm -D --defined-only "$library" | awk '{print $3}' | sort)"
others="$(grep -v '^pagealloc_' <<< "$exported" || true)"
if [[ -n "$others" ]]; then
  echo "libpagealloc_client.so exports symbols outside the C ABI:" >&2
  echo "$others" >&2
  exit 1
fi
declared="$(grep -o '\bpagealloc_[a-z0-9_]*(' "$header" | tr -d '(' | sort -u)"
if [[ "$exported" != "$declared" ]]; then
  echo "exported and declared functions differ (< exported, > declared):" >&2
  diff <(echo "$exported") <(echo "$declared") >&2 || true
  exit 1
fi
echo "pagealloc_symbols_test: $(wc -l <<< "$exported") functions, all pagealloc_*"
