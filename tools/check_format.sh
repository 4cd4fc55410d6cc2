#!/usr/bin/env bash
# Checks that every tracked C++ and CUDA file (*.cc *.h *.cu *.cuh) outside
# third_party/ is formatted as .clang-format says, with Debian 12's
# clang-format (14; another major version formats some constructs
# differently). Prints the files that are not and the command that formats
# them; exits 1 if there are any, 2 if it cannot check.
#   tools/check_format.sh            CLANG_FORMAT=clang-format-14 picks one
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

clang_format=${CLANG_FORMAT:-clang-format}
if ! command -v "$clang_format" > /dev/null; then
  echo "check_format: $clang_format not found; install Debian's clang-format" \
    "(./bazelw installs it)" >&2
  exit 2
fi
version=$("$clang_format" --version)
if [[ ! $version =~ version\ 14\. ]]; then
  echo "check_format: warning: CI formats with clang-format 14, this is:" \
    "$version" >&2
fi

if ! mapfile -d '' files < <(git ls-files -z -- '*.cc' '*.h' '*.cu' '*.cuh' \
  ':(exclude)third_party/**') || ((${#files[@]} == 0)); then
  echo "check_format: no tracked C++ files found (not a git checkout?)" >&2
  exit 2
fi

unformatted=()
for file in "${files[@]}"; do
  "$clang_format" --dry-run --Werror "$file" > /dev/null 2>&1 ||
    unformatted+=("$file")
done

if ((${#unformatted[@]})); then
  echo "check_format: ${#unformatted[@]} of ${#files[@]} files are not" \
    "formatted:"
  printf '  %s\n' "${unformatted[@]}"
  echo "Format them with:"
  echo "  $clang_format -i ${unformatted[*]}"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted (${version})"
