#!/bin/sh
# Bazel's --workspace_status_command (.bazelrc): the commit the binaries are
# built from, as STABLE_GIT_COMMIT, which //common:build_commit stamps into
# their --version. A 12-digit hash, with "-modified" when tracked files
# differ from it; PAGEALLOC_COMMIT from the environment where there is no
# git repository (a source tarball, the container build's context);
# else "unknown".
commit=${PAGEALLOC_COMMIT:-}
if [ -z "$commit" ] && commit=$(git rev-parse --short=12 HEAD 2>/dev/null); then
  if [ -n "$(git --no-optional-locks status --porcelain \
      --untracked-files=no 2>/dev/null)" ]; then
    commit="$commit-modified"
  fi
fi
echo "STABLE_GIT_COMMIT ${commit:-unknown}"
