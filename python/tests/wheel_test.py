#!/usr/bin/python3
"""The wheel as a user gets it: pip accepts it, and the installed package
imports, finds the library it carries and serves a session.

    wheel_test.py WHEEL PAGEALLOC_SERVER

1. Every RECORD line names a file of the wheel with its sha256 and size,
   and the wheel's tag is py3-none-linux_x86_64.
2. Debian's pip (/usr/bin/python3 -m pip) installs it into a scratch
   directory, offline.
3. A fresh interpreter with only that directory added imports pagealloc
   (no PAGEALLOC_LIBRARY: the library beside the package), connects to a
   real daemon and allocates.
"""

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

SMOKE = r"""
import sys, time
import numpy as np
import pagealloc
site, target = sys.argv[1], sys.argv[2]
assert pagealloc.LIBRARY_PATH.startswith(site), pagealloc.LIBRARY_PATH
deadline = time.monotonic() + 20  # until the daemon listens
while True:
    try:
        client = pagealloc.Client.connect(target, name="wheel")
        break
    except pagealloc.UnavailableError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
with client:
    a = client.alloc([8]).check()
    assert np.asarray(a.slots).tolist() == list(range(8, 16)), a.slots
    print("wheel OK:", pagealloc.__version__, client.pool)
"""


def check_record(path):
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        records = [n for n in names if n.endswith(".dist-info/RECORD")]
        assert len(records) == 1, records
        lines = wheel.read(records[0]).decode().splitlines()
        listed = set()
        for line in lines:
            name, digest, size = line.rsplit(",", 2)
            listed.add(name)
            if name == records[0]:
                assert digest == "" and size == ""
                continue
            data = wheel.read(name)
            expected = "sha256=" + base64.urlsafe_b64encode(
                hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == expected, (name, digest, expected)
            assert int(size) == len(data), name
        assert listed == names, names ^ listed
        wheel_file = records[0].replace("RECORD", "WHEEL")
        assert "Tag: py3-none-linux_x86_64" in wheel.read(wheel_file).decode()
        assert "pagealloc/libpagealloc_client.so" in names


def sanitizer_preload(library):
    """The sanitizer runtimes `library` needs (a --config=asan build), which
    must be preloaded into an interpreter not built with them."""
    listed = subprocess.run(["ldd", library], capture_output=True, text=True,
                            check=True).stdout
    return ":".join(line.split()[2] for line in listed.splitlines()
                    if "libasan.so" in line or "libubsan.so" in line)


def main():
    wheel, server = sys.argv[1], sys.argv[2]
    check_record(wheel)
    scratch = tempfile.mkdtemp(prefix="pagealloc-wheel-", dir="/tmp")
    site = os.path.join(scratch, "site")
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_CACHE_DIR="1", HOME=scratch)
    env.pop("PAGEALLOC_LIBRARY", None)
    env.pop("PYTHONPATH", None)
    subprocess.run(["/usr/bin/python3", "-m", "pip", "install", "--no-index",
                    "--no-deps", "--target", site, wheel], check=True, env=env)
    socket = os.path.join(scratch, "daemon.sock")
    target = "unix://" + socket
    log = open(os.path.join(scratch, "daemon.log"), "w")
    daemon = subprocess.Popen(
        [server, "--backend=cpu", "--num_pages=16", "--page_size=8",
         "--listen=" + target, "--metrics_host=127.0.0.1",
         "--metrics_port=0"], stdout=log, stderr=subprocess.STDOUT)
    try:
        env["PYTHONPATH"] = site
        preload = sanitizer_preload(
            os.path.join(site, "pagealloc", "libpagealloc_client.so"))
        if preload:
            env["LD_PRELOAD"] = preload
            env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + \
                ":detect_leaks=0"
        smoke = subprocess.run(["/usr/bin/python3", "-c", SMOKE, site,
                                target], env=env, cwd=scratch)
    finally:
        daemon.terminate()
        daemon.wait(timeout=20)
        log.close()
    if smoke.returncode != 0:
        with open(log.name) as f:
            sys.exit("the installed package failed; the daemon's log:\n" +
                     f.read())
    shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
