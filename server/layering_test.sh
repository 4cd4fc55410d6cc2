#!/bin/bash
# Checks edges of the server's graph that visibility cannot refuse (//proto
# is public, and targets of one package see each other): each argument is
# "QUERY_OUTPUT FORBIDDEN_REGEX DESCRIPTION", QUERY_OUTPUT the transitive
# dependencies of one target (a genquery); the test fails, naming the
# offending targets, when any of them matches FORBIDDEN_REGEX.
set -u
failed=0
for check in "$@"; do
  read -r deps forbidden what <<<"${check}"
  if [[ ! -s "${deps}" ]]; then
    echo "FAIL: ${deps} is empty or missing"
    failed=1
    continue
  fi
  if offending=$(grep -E "${forbidden}" "${deps}"); then
    echo "FAIL: ${what}; it depends on:"
    echo "${offending}"
    failed=1
  else
    echo "ok: ${what} ($(wc -l <"${deps}") targets)"
  fi
done
exit "${failed}"
