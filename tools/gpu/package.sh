#!/usr/bin/env bash
# Builds, on this build host (no GPU needed, the CUDA toolkit is), everything
# the GPU run scripts need with -c opt, and packages it with the Debian
# shared libraries it links, so that a GPU host without Bazel or Debian's
# -dev packages can run it (tools/gpu/README.md):
#   DEST/bin/      the binaries without debug sections, laid out as in
#                  bazel-bin (server/, client/, memory/, tests/, tests/gpu/,
#                  bench/)
#   DEST/lib/      the shared libraries they link (from ldd), except the C
#                  and C++ runtimes every Linux host has (glibc, libstdc++,
#                  libgcc_s) and the NVIDIA driver's own
#   DEST/python/   the Python package and its tests (python/)
#   DEST/anchor/   with --anchor DIR: the seed's triton_anchor.py and
#                  seed_triton_kernels.py, for run_kernels.sh, and
#                  sglang_unsynced_call.py where DIR has it, for run_e2e.sh
#   DEST/run_kernels.sh, run_daemon_suite.sh, run_e2e.sh, run_engines.sh
#                  and their helpers,
#   DEST/MANIFEST  the commit, the build host and the packaged files
# Usage: tools/gpu/package.sh [--anchor DIR] DEST
#   DEST: a directory (replaced if it holds a package), or NAME.tar.gz for a
#   tarball whose top directory is NAME. JOBS sets Bazel's --jobs (2).

set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

die() {
  echo "package.sh: $*" >&2
  exit 2
}

anchor=
dest=
while (($#)); do
  case $1 in
    --anchor) anchor=${2:?--anchor needs a directory}; shift 2 ;;
    --anchor=*) anchor=${1#--anchor=}; shift ;;
    -h | --help) sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) [[ -z $dest ]] || die "one DEST only"; dest=$1; shift ;;
  esac
done
[[ -n $dest ]] || die "usage: package.sh [--anchor DIR] DEST (see --help)"
if [[ -n $anchor ]]; then
  for f in triton_anchor.py seed_triton_kernels.py; do
    [[ -f $anchor/$f ]] || die "--anchor $anchor has no $f"
  done
fi

# Bazel labels, and where each binary lands under bazel-bin and bin/.
targets=(
  //tests/gpu:cuda_executor_test
  //tests/gpu:completion_counter_test
  //tests/gpu:release_fence_test
  //tests/gpu:kv_slab_gpu_test
  //tests/gpu:ring_flood_test
  //tests/gpu:local_expansion_test
  //tests/gpu:copy_to_host_test
  //memory:cuda_vmm_test
  //tests:kv_slab_test
  //tests:kv_writer
  //client:kv_example
  //client:libpagealloc_client.so
  //bench:kernel_benchmark
  //bench:kv_scrub_gpu_benchmark
  //bench:prefix_match_benchmark
  //allocator:prefix_benchmark
  //kept_state:snapshot_benchmark
  //bench:pagealloc-bench
  //server:pagealloc-server
  //client:pagealloc-cli
  //tests:load_client
  //tests:multi_client_test
  //tests:restart_test
  //tests:server_process_test
  //tests:stress_test
)
binaries=()
for t in "${targets[@]}"; do
  binaries+=("${t#//}")
done
binaries=("${binaries[@]/://}")

# Where the package is staged: DEST itself, or a directory to tar.
tarball=
if [[ $dest == *.tar.gz ]]; then
  tarball=$(realpath -m "$dest")
  name=$(basename "$dest" .tar.gz)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  stage=$tmp/$name
else
  stage=$(realpath -m "$dest")
  if [[ -e $stage ]]; then
    [[ -f $stage/MANIFEST || -z $(ls -A "$stage") ]] ||
      die "$stage exists and is not a package: refusing to replace it"
    rm -rf "$stage"
  fi
fi

cd "$root"
if [[ ! -x ${CUDA_HOME:-/usr/local/cuda}/bin/nvcc ]]; then
  die "no CUDA toolkit (${CUDA_HOME:-/usr/local/cuda}/bin/nvcc): the kernel" \
    "binaries need one on this build host (no GPU needed)"
fi
echo "== building ${#targets[@]} targets with -c opt"
./bazelw build -c opt --jobs="${JOBS:-2}" "${targets[@]}"
bazel_bin=$(./bazelw info -c opt bazel-bin 2>/dev/null)

mkdir -p "$stage/bin" "$stage/lib"
for b in "${binaries[@]}"; do
  [[ -x $bazel_bin/$b ]] || die "the build made no $bazel_bin/$b"
  install -D -m 755 "$bazel_bin/$b" "$stage/bin/$b"
  # Without their debug sections (a fifth of the size; the symbol table
  # stays, so backtraces still name functions): the whole package then
  # travels in one call to a GPU host that takes at most 64 MiB.
  strip --strip-debug "$stage/bin/$b"
done

# The shared libraries, by soname. Left out: glibc's libraries and the
# loader, libstdc++ and libgcc_s (every host has them; ldd on the GPU host
# says if one is too old), and the NVIDIA driver's (they must match the
# host's kernel module; the CUDA runtime is linked statically).
base='^(linux-vdso|linux-gate|ld-linux.*|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libnsl|libBrokenLocale|libstdc\+\+|libgcc_s|libcuda|libnvidia-.*)\.so(\.[0-9]+)*$'
declare -A libs=()
for b in "${binaries[@]}"; do
  while read -r soname arrow path _; do
    [[ $arrow == "=>" ]] || continue
    [[ $soname =~ $base ]] && continue
    [[ $path == not ]] && die "$b: $soname not found by ldd"
    libs[$soname]=$path
  done < <(ldd "$stage/bin/$b")
done
for soname in "${!libs[@]}"; do
  cp -L "${libs[$soname]}" "$stage/lib/$soname"
done

cp tools/gpu/gpu_common.sh tools/gpu/run_kernels.sh \
  tools/gpu/run_daemon_suite.sh tools/gpu/run_e2e.sh tools/gpu/run_engines.sh \
  tools/gpu/e2e_summary.py \
  tools/gpu/README.md bench/compare.py bench/plot.sh "$stage/"
# The Python package and its tests, run on the GPU host against
# bin/client/libpagealloc_client.so (PAGEALLOC_LIBRARY).
tar -C "$root" --exclude=__pycache__ -cf - python | tar -C "$stage" -xf -
if [[ -n $anchor ]]; then
  mkdir -p "$stage/anchor"
  cp "$anchor/triton_anchor.py" "$anchor/seed_triton_kernels.py" "$stage/anchor/"
  if [[ -f $anchor/sglang_unsynced_call.py ]]; then
    cp "$anchor/sglang_unsynced_call.py" "$stage/anchor/"
  fi
fi

# The Debian package that owns a library (dpkg knows some by their /lib
# path, some by /usr/lib), or the library's path.
debian_package() {
  local real candidate owner
  real=$(realpath "$1")
  for candidate in "$1" "$real" "${real#/usr}"; do
    owner=$(dpkg -S "$candidate" 2>/dev/null | cut -d: -f1 | head -n 1) &&
      [[ -n $owner ]] && { echo "$owner"; return; }
  done
  echo "$real"
}

commit=$(git rev-parse --short=10 HEAD)
git diff --quiet HEAD -- || commit+="-dirty"
{
  echo "commit $commit"
  echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname):" \
    "$(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -n 1)," \
    "$("${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version | tail -n 1)"
  echo "bazel -c opt ${targets[*]}"
  echo
  echo "binaries:"
  (cd "$stage/bin" && find . -type f | sort | sed 's|^\./|  |')
  echo "libraries (Debian package):"
  for soname in $(printf '%s\n' "${!libs[@]}" | sort); do
    echo "  $soname ($(debian_package "${libs[$soname]}"))"
  done
} >"$stage/MANIFEST"

if [[ -n $tarball ]]; then
  mkdir -p "$(dirname "$tarball")"
  tar -C "$(dirname "$stage")" -czf "$tarball" "$(basename "$stage")"
  where=$tarball
else
  where=$stage
fi
echo "== packaged commit $commit: ${#binaries[@]} binaries, ${#libs[@]}" \
  "libraries, $(du -sh "$where" | cut -f1) in $where"
echo "On the GPU host (README.md inside says more):"
if [[ -n $tarball ]]; then
  echo "  tar xzf $(basename "$tarball")"
fi
pkg=$(basename "$stage")
echo "  $pkg/run_kernels.sh; $pkg/run_daemon_suite.sh; $pkg/run_e2e.sh;" \
  "$pkg/run_engines.sh" \
  "  # results in ./gpu-results"
