#!/bin/bash
# Installs the C ABI of the client library: pagealloc.h, libpagealloc_client.so
# and its pkg-config file.
#
#   ./bazelw run //client:install -- --prefix=/usr/local
#   options: --prefix=DIR (default /usr/local), --libdir=DIR (default
#   PREFIX/lib), --destdir=DIR (stage under DIR, as DESTDIR in make install)
#
# Then: cc prog.c $(pkg-config --cflags --libs pagealloc_client)
# (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig when PREFIX is not a system one).
# The flags carry a run path to LIBDIR, so the program finds the library
# there without LD_LIBRARY_PATH; a program linked otherwise needs LIBDIR on
# the loader's path (ldconfig, or LD_LIBRARY_PATH).
# At run time the library needs Debian 12's gRPC, protobuf and Abseil shared
# libraries (libgrpc++1.51, libprotobuf32, libabsl20220623): docs/python.md.
set -euo pipefail

prefix=/usr/local
libdir=""
destdir=""
for arg in "$@"; do
  case "$arg" in
    --prefix=*) prefix="${arg#--prefix=}" ;;
    --libdir=*) libdir="${arg#--libdir=}" ;;
    --destdir=*) destdir="${arg#--destdir=}" ;;
    -h | --help)
      sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "install: unknown argument $arg (see --help)" >&2
      exit 2
      ;;
  esac
done
[[ "$prefix" == /* ]] || { echo "install: --prefix must be absolute" >&2; exit 2; }
libdir="${libdir:-$prefix/lib}"

# The files, from this binary's runfiles (bazel run, or a test).
runfiles="${RUNFILES_DIR:-$0.runfiles}/pagealloc"
[[ -d "$runfiles" ]] || runfiles="$PWD"
header="$runfiles/client/pagealloc.h"
library="$runfiles/client/libpagealloc_client.so"
template="$runfiles/client/pagealloc_client.pc.in"
version="$(sed -n 's/.*kPageallocVersion\[\] = "\(.*\)";/\1/p' \
  "$runfiles/common/version.h")"

install -d "$destdir$prefix/include" "$destdir$libdir/pkgconfig"
install -m 0644 "$header" "$destdir$prefix/include/pagealloc.h"
install -m 0755 "$library" "$destdir$libdir/libpagealloc_client.so"
sed -e "s|@PREFIX@|$prefix|" -e "s|@LIBDIR@|$libdir|" \
  -e "s|@VERSION@|$version|" "$template" \
  > "$destdir$libdir/pkgconfig/pagealloc_client.pc"
echo "installed pagealloc.h, libpagealloc_client.so and pagealloc_client.pc" \
  "under $destdir$prefix"
