#!/bin/bash
# ./bazelw for a user without sudo (a minimal Debian 12 has none): a missing
# package ends in a message that names the packages and the command to run
# as root, exit code 1, and no attempt to run sudo or apt-get.
#
# The packages look missing because dpkg-query reads an empty package
# database (DPKG_ADMINDIR); the user is not root (nobody, when the test runs
# as root) and sudo is not on PATH (a PATH of only the commands bazelw uses).
set -euo pipefail
bazelw="$(readlink -f "$1")"
# Under /tmp: nobody cannot reach Bazel's test directories (root's home).
scratch="$(mktemp -d /tmp/pagealloc-bazelw.XXXXXX)"
trap 'rm -rf "$scratch"' EXIT
chmod 0755 "$scratch"
mkdir -p "$scratch/dpkg/info" "$scratch/dpkg/updates" "$scratch/bin"
: > "$scratch/dpkg/status"
for command in bash env id dpkg-query dirname; do
  ln -s "$(command -v "$command")" "$scratch/bin/$command"
done
cp "$bazelw" "$scratch/bazelw"
chmod -R a+rX "$scratch"
as_user=()
if [[ $(id -u) -eq 0 ]]; then
  as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
rc=0
"${as_user[@]}" env -i PATH="$scratch/bin" DPKG_ADMINDIR="$scratch/dpkg" \
  "$scratch/bin/bash" "$scratch/bazelw" --version \
  > "$scratch/out" 2>&1 || rc=$?
cat "$scratch/out"
fail() {
  echo "bazelw_test: $*" >&2
  exit 1
}
((rc == 1)) || fail "exit code $rc, expected 1"
grep -q '^bazelw: missing Debian packages: bazel-bootstrap g++ ' "$scratch/out" ||
  fail "no list of the missing packages"
grep -q '^bazelw: sudo is not installed; as root, run:$' "$scratch/out" ||
  fail "no word on sudo"
grep -q '^  apt-get update && apt-get install --no-install-recommends bazel-bootstrap g++ .* python3-torch$' \
  "$scratch/out" || fail "no command for root"
if grep -q -E 'command not found|Permission denied' "$scratch/out"; then
  fail "bazelw tried a command it does not have"
fi
echo "bazelw_test: OK"
