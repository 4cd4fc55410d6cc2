# shellcheck shell=bash disable=SC2034  # ANCHOR, VARIANTS: the callers'
# Shared by the run_*.sh scripts of a GPU package (tools/gpu/README.md);
# sourced, not run. The caller sets STEP_KIND (the subdirectory of the output
# directory it writes) before sourcing it, then calls gpu_setup "$@".
#
# Provides:
#   PKG          the package directory (this file's directory)
#   BIN, LIB     $PKG/bin (binaries, laid out as bazel-bin) and $PKG/lib
#   OUT          the output directory for this script's results
#   gpu_setup ARGS...    parses [--anchor DIR] [--variant FLAGS]... [OUT_DIR]
#                        into ANCHOR, VARIANTS and OUT, checks the driver and
#                        the libraries, records the host in $OUT/env.txt;
#                        with MPS=1 in the environment, starts a CUDA MPS
#                        control daemon of the run's own (start_mps)
#   at_exit CMD          runs the shell command CMD when the script exits
#   need_binaries REL... fails unless each $BIN/REL runs with the packaged
#                        libraries
#   run_step NAME SECS LOG CMD...  runs CMD with a time limit, its output
#                        appended to LOG; records NAME, the exit status and
#                        LOG for the summary
#   note_step NAME RESULT DETAIL   records a row of the summary directly
#   add_detail TEXT      appends TEXT to the last row's details
#   gtest_counts LOG     "N passed, N skipped, N failed" from a GoogleTest log
#   add_section TEXT     a block (e.g. a benchmark's Markdown table) that
#                        print_summary prints after its table
#   print_summary        prints the summary table and the sections (also to
#                        $OUT/summary.md) and returns 1 if any step failed

PKG=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=$PKG/bin
LIB=$PKG/lib
ANCHOR=
VARIANTS=()
OUT=
STEP_NAMES=()
STEP_RESULTS=()
STEP_DETAILS=()
SECTIONS=()
FAILED_STEPS=0

die() {
  echo "error: $*" >&2
  exit 2
}

usage_of() {  # the comment block at the top of the calling script
  sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0"
}

gpu_setup() {
  local out=
  while (($#)); do
    case $1 in
      --anchor) ANCHOR=${2:?--anchor needs a directory}; shift 2 ;;
      --anchor=*) ANCHOR=${1#--anchor=}; shift ;;
      --variant) VARIANTS+=("${2:?--variant needs flags}"); shift 2 ;;
      --variant=*) VARIANTS+=("${1#--variant=}"); shift ;;
      -h | --help) usage_of; exit 0 ;;
      -*) die "unknown option $1 (see --help)" ;;
      *) [[ -z $out ]] || die "one output directory only"; out=$1; shift ;;
    esac
  done
  OUT=$(realpath -m "${out:-./gpu-results}")/$STEP_KIND

  [[ -d $BIN && -d $LIB && -f $PKG/MANIFEST ]] ||
    die "$PKG is not a GPU package (no bin/, lib/ or MANIFEST): build one" \
      "with tools/gpu/package.sh on the build host and run the copy of" \
      "this script inside it"
  check_driver
  # A rerun replaces this script's results: its steps append to their logs.
  rm -rf "$OUT"
  mkdir -p "$OUT" || die "cannot create $OUT"
  [[ ${MPS:-0} == 1 ]] && start_mps
  export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # compute-sanitizer and the toolkit's tools, where the toolkit is installed.
  export PATH=$PATH:${CUDA_HOME:-/usr/local/cuda}/bin
  {
    echo "package: $(grep -E '^(commit|built)' "$PKG/MANIFEST" | tr '\n' ' ')"
    echo "host: $(hostname), $(nproc) CPUs, $(lscpu 2>/dev/null |
      sed -n 's/^Model name: *//p')"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total \
      --format=csv
    echo "CUDA MPS: ${CUDA_MPS_PIPE_DIRECTORY:+on, control pipe in $CUDA_MPS_PIPE_DIRECTORY}${CUDA_MPS_PIPE_DIRECTORY:-off}"
  } >"$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
}

# Starts a CUDA MPS control daemon for this run and points every process the
# script starts at it, so that the daemon's and the clients' CUDA contexts
# share the GPU instead of time-slicing it (docs/operations.md, "CUDA
# MPS"); the control daemon quits when the script exits. Its pipe directory
# is short-named under /tmp (a Unix socket path is at most 107 bytes), its
# logs go to $OUT/mps-log.
start_mps() {
  command -v nvidia-cuda-mps-control >/dev/null ||
    die "MPS=1, but this host has no nvidia-cuda-mps-control"
  CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/pagealloc-mps.XXXXXX) ||
    die "cannot create an MPS pipe directory"
  export CUDA_MPS_PIPE_DIRECTORY
  export CUDA_MPS_LOG_DIRECTORY=$OUT/mps-log
  mkdir -p "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d ||
    die "nvidia-cuda-mps-control -d failed (see $CUDA_MPS_LOG_DIRECTORY)"
  # shellcheck disable=SC2016  # expanded when the script exits
  at_exit 'echo quit | nvidia-cuda-mps-control; rm -rf "$CUDA_MPS_PIPE_DIRECTORY"'
}

# Runs the shell command CMD when the script exits, after those registered
# before it: the one EXIT trap the scripts and this file share.
# Usage: at_exit CMD
AT_EXIT=()
at_exit() {
  AT_EXIT+=("$1")
  # shellcheck disable=SC2154  # cmd is the trap's own loop variable
  trap 'for cmd in "${AT_EXIT[@]}"; do eval "$cmd"; done' EXIT
}

# Refuses to go on where there is no NVIDIA driver or GPU, before anything
# runs, so that a run on the wrong machine says so instead of failing later.
check_driver() {
  command -v nvidia-smi >/dev/null ||
    die "no NVIDIA driver on this host (nvidia-smi not found): run this on a" \
      "GPU host"
  local gpus
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1) ||
    die "no NVIDIA driver answering on this host (nvidia-smi: $gpus)"
  [[ -n $gpus ]] || die "nvidia-smi lists no GPU on this host"
}

need_binaries() {
  local rel missing
  for rel in "$@"; do
    [[ -x $BIN/$rel ]] || die "the package has no bin/$rel"
    # ldd names each library the loader cannot find, and each symbol
    # version (GLIBC_*, GLIBCXX_*) this host's base libraries lack.
    missing=$(ldd "$BIN/$rel" 2>&1 | grep -E 'not found') &&
      die "bin/$rel cannot load on this host:"$'\n'"$missing"
  done
  return 0
}

run_step() {
  local name=$1 secs=$2 log=$3
  shift 3
  echo "== $name: $* (limit ${secs}s)" | tee -a "$log"
  timeout "$secs" "$@" >>"$log" 2>&1
  local rc=$?
  echo "== exit $rc" | tee -a "$log"
  tail -n 4 "$log"
  local result=ok
  if ((rc == 124)); then
    result="TIMED OUT (${secs}s)"
  elif ((rc != 0)); then
    result="FAILED (exit $rc)"
  fi
  note_step "$name" "$result" "$(basename "$log")"
  return "$rc"
}

note_step() {
  [[ $2 == ok* || $2 == skipped* ]] || FAILED_STEPS=$((FAILED_STEPS + 1))
  STEP_NAMES+=("$1")
  STEP_RESULTS+=("$2")
  STEP_DETAILS+=("$3")
}

add_detail() {
  local last=$((${#STEP_DETAILS[@]} - 1))
  STEP_DETAILS[last]+="${STEP_DETAILS[last]:+; }$*"
}

add_section() {
  SECTIONS+=("$*")
}

gtest_counts() {
  local log=$1 kind n out=()
  for kind in PASSED SKIPPED FAILED; do
    n=$(sed -n "s/^\[  $kind  *\] \([0-9]*\) tests\{0,1\}[,.].*/\1/p" "$log" |
      tail -n 1)
    [[ -n $n ]] && out+=("$n ${kind,,}")
  done
  ((${#out[@]})) || out=("no GoogleTest summary")
  local joined
  joined=$(printf '%s, ' "${out[@]}")
  echo "${joined%, }"
}

print_summary() {
  {
    echo
    echo "## $STEP_KIND: $(grep -E '^commit' "$PKG/MANIFEST")"
    echo
    echo "| step | result | details |"
    echo "| --- | --- | --- |"
    local i
    for i in "${!STEP_NAMES[@]}"; do
      echo "| ${STEP_NAMES[i]} | ${STEP_RESULTS[i]} | ${STEP_DETAILS[i]} |"
    done
    echo
    local section
    for section in "${SECTIONS[@]}"; do
      echo "$section"
      echo
    done
    echo "results: $OUT"
  } | tee "$OUT/summary.md"
  ((FAILED_STEPS == 0))
}
