#!/usr/bin/python3
"""Writes the pagealloc wheel (PEP 427) with the standard library only.

    build_wheel.py --out OUT.whl --version V --version_header common/version.h
                   --library libpagealloc_client.so --readme docs/python.md
                   pagealloc/__init__.py ...

The wheel carries the package's modules and libpagealloc_client.so beside
them. Its tag is py3-none-linux_x86_64: the modules run on every CPython 3
(ctypes, no extension module), and the library is an x86-64 Linux shared
object that links Debian 12's gRPC, protobuf and Abseil, so it is no
manylinux wheel. Entries are sorted and dated 1980-01-01: the same inputs
give the same bytes.
"""

import argparse
import base64
import hashlib
import os
import re
import sys
import zipfile

TAG = "py3-none-linux_x86_64"
DATE = (1980, 1, 1, 0, 0, 0)

SUMMARY = ("Python client of pagealloc, a KV-cache page allocator daemon: "
           "zero-copy slots for schedulers")


def record_hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def release_version(path):
    """The release common/version.h names (what pagealloc_version()
    reports). Read from the header rather than asked of the library: a
    sanitizer build's library cannot be loaded into this interpreter."""
    with open(path) as f:
        match = re.search(r'kPageallocVersion\[\]\s*=\s*"([^"]+)"', f.read())
    if not match:
        sys.exit("build_wheel: no kPageallocVersion in %s" % path)
    return match.group(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--version_header", required=True)
    parser.add_argument("--library", required=True)
    parser.add_argument("--readme", required=True)
    parser.add_argument("modules", nargs="+")
    args = parser.parse_args()

    # The wheel's file name is fixed in BUILD; it must be the release's.
    release = release_version(args.version_header)
    if args.version != release:
        sys.exit("build_wheel: --version %s differs from %s's %s: update "
                 "python/BUILD.bazel" % (args.version, args.version_header,
                                         release))
    name = "pagealloc"
    dist_info = "%s-%s.dist-info" % (name, args.version)

    files = {}  # archive name -> (bytes, mode)
    for module in args.modules:
        with open(module, "rb") as f:
            files["pagealloc/" + os.path.basename(module)] = (f.read(), 0o644)
    with open(args.library, "rb") as f:
        files["pagealloc/libpagealloc_client.so"] = (f.read(), 0o755)
    with open(args.readme) as f:
        readme = f.read()
    metadata = "".join([
        "Metadata-Version: 2.1\n",
        "Name: %s\n" % name,
        "Version: %s\n" % args.version,
        "Summary: %s\n" % SUMMARY,
        "Platform: linux_x86_64\n",
        "Requires-Python: >=3.8\n",
        "Requires-Dist: numpy\n",
        "Description-Content-Type: text/markdown\n",
        "\n",
        readme,
    ])
    files[dist_info + "/METADATA"] = (metadata.encode(), 0o644)
    wheel = "".join([
        "Wheel-Version: 1.0\n",
        "Generator: pagealloc python/build_wheel.py\n",
        "Root-Is-Purelib: false\n",
        "Tag: %s\n" % TAG,
    ])
    files[dist_info + "/WHEEL"] = (wheel.encode(), 0o644)
    files[dist_info + "/top_level.txt"] = (b"pagealloc\n", 0o644)

    record = "".join("%s,%s,%d\n" % (path, record_hash(data), len(data))
                     for path, (data, _) in sorted(files.items()))
    record += dist_info + "/RECORD,,\n"
    files[dist_info + "/RECORD"] = (record.encode(), 0o644)

    # dist-info last, RECORD at the very end, as PEP 427 recommends.
    def order(path):
        return (path.startswith(dist_info), path.endswith("/RECORD"), path)

    with zipfile.ZipFile(args.out, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(files, key=order):
            data, mode = files[path]
            info = zipfile.ZipInfo(path, date_time=DATE)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)


if __name__ == "__main__":
    main()
