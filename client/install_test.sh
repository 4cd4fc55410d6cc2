#!/bin/bash
# //client:install puts the header, the library and the pkg-config file
# where pkg-config finds them, and a C program built with nothing but
# `pkg-config --cflags --libs pagealloc_client` links and runs.
set -euo pipefail
install="$1"
root="$TEST_TMPDIR/root"
"$install" --prefix=/opt/pagealloc --destdir="$root"
prefix="$root/opt/pagealloc"
for file in include/pagealloc.h lib/libpagealloc_client.so \
  lib/pkgconfig/pagealloc_client.pc; do
  [[ -f "$prefix/$file" ]] || { echo "missing $file" >&2; exit 1; }
done
# pkg-config sees the staged tree as installed under /opt/pagealloc.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$root"
[[ "$(pkg-config --modversion pagealloc_client)" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]
cat > "$TEST_TMPDIR/program.c" <<'PROGRAM'
#include <pagealloc.h>
#include <stdio.h>
#include <string.h>
int main(void) {
  pagealloc_client_options options;
  pagealloc_client* client;
  pagealloc_error error;
  int32_t code;
  if (pagealloc_abi_version() != PAGEALLOC_ABI_VERSION) return 1;
  pagealloc_client_options_init(&options, sizeof(options));
  options.target = "unix:///nonexistent/install-test.sock";
  code = pagealloc_connect(&options, &client, &error);
  printf("%s: %s\n", pagealloc_status_code_name(code), error.message);
  return code == PAGEALLOC_UNAVAILABLE ? 0 : 1;
}
PROGRAM
# A --config=asan library needs its sanitizer runtimes first in a program
# not built with them.
preload="$(ldd "$prefix/lib/libpagealloc_client.so" |
  awk '/lib(asan|ubsan)\.so|libclang_rt\.asan/ {print $3}' | paste -sd: -)"
# shellcheck disable=SC2046  # pkg-config's output is a list of flags
gcc -std=c99 -Wall -Werror -o "$TEST_TMPDIR/program" "$TEST_TMPDIR/program.c" \
  $(pkg-config --cflags --libs pagealloc_client)
LD_PRELOAD="$preload" LD_LIBRARY_PATH="$prefix/lib" "$TEST_TMPDIR/program"

# Installed for real (no --destdir), a program built with the .pc file's
# flags runs with no LD_LIBRARY_PATH: the flags carry the library's run path.
real="$TEST_TMPDIR/usr-local"
"$install" --prefix="$real"
unset PKG_CONFIG_SYSROOT_DIR LD_LIBRARY_PATH
export PKG_CONFIG_PATH="$real/lib/pkgconfig"
[[ "$(pkg-config --libs pagealloc_client)" == *"-Wl,-rpath,$real/lib"* ]] || {
  echo "pagealloc_client.pc sets no run path: $(pkg-config --libs \
    pagealloc_client)" >&2
  exit 1
}
# shellcheck disable=SC2046  # pkg-config's output is a list of flags
gcc -std=c99 -Wall -Werror -o "$TEST_TMPDIR/installed" "$TEST_TMPDIR/program.c" \
  $(pkg-config --cflags --libs pagealloc_client)
LD_PRELOAD="$preload" "$TEST_TMPDIR/installed"
echo "install_test: OK"
