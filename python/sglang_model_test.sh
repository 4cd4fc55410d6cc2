#!/bin/bash
# Runs python/tests/test_sglang_model.py with Debian's interpreter. The
# model is imported from its file alone: it needs NumPy, not the package's
# native library.
set -euo pipefail
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}/python"
staging="$(mktemp -d)"
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging/pagealloc"
cp "$runfiles/pagealloc/sglang_model.py" "$staging/pagealloc/"
touch "$staging/pagealloc/__init__.py"
export PYTHONPATH="$staging"
export PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 -m pytest -p no:cacheprovider -v \
  --rootdir="$staging" "$runfiles/tests/test_sglang_model.py"
