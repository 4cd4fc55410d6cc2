#!/usr/bin/python3
"""The wheel as a user gets it: pip accepts it, and the installed package
imports, finds the library it carries and serves a session.

    wheel_test.py WHEEL PAGEALLOC_SERVER PYTHON_MD

1. Every RECORD line names a file of the wheel with its sha256 and size,
   and the wheel's tag is py3-none-linux_x86_64.
2. Debian's pip (/usr/bin/python3 -m pip) installs it into a scratch
   directory, offline.
3. A fresh interpreter with only that directory added imports pagealloc
   (no PAGEALLOC_LIBRARY: the library beside the package), connects to a
   real daemon and allocates.
4. docs/python.md's install commands, exactly as the doc shows them (the
   block after its "Run verbatim" marker), run by bash in a directory laid
   out as the repository after `./bazelw build //python:wheel`, as root and
   as an unprivileged user (nobody, with a home of its own): each gets a
   virtual environment whose interpreter serves a session as in 3.
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
    runtimes = ("libasan.so", "libubsan.so", "libclang_rt.asan")
    return ":".join(line.split()[2] for line in listed.splitlines()
                    if any(runtime in line for runtime in runtimes))


DOC_MARKER = "<!-- Run verbatim, as root and as a user, by //python:wheel_test. -->"


def doc_install_commands(python_md):
    """The indented block that follows DOC_MARKER, as shell lines."""
    with open(python_md) as f:
        text = f.read()
    assert text.count(DOC_MARKER) == 1, "docs/python.md lost its marker"
    lines = text.split(DOC_MARKER, 1)[1].splitlines()
    block = []
    for line in lines:
        if line.startswith("    "):
            block.append(line[4:])
        elif block and line.strip():
            break
    assert block and block[0].startswith("/usr/bin/python3 -m venv"), block
    return block


def run_doc_install(commands, wheel, server, scratch, as_user, preload):
    """Runs `commands` in a copy of the repository's wheel layout, as root
    or as nobody, then the smoke test with the environment's python.
    `preload`: the sanitizer runtimes the library needs (a --config=asan
    build), preloaded into the commands' interpreters."""
    who = "nobody" if as_user else "self"
    home = os.path.join(scratch, "home-" + who)
    repo = os.path.join(scratch, "repo-" + who)
    os.makedirs(os.path.join(repo, "bazel-bin", "python"))
    os.makedirs(home)
    shutil.copy(wheel, os.path.join(repo, "bazel-bin", "python",
                                    os.path.basename(wheel)))
    prefix = []
    if as_user:
        for root, dirs, files in os.walk(scratch):
            for name in dirs + files:
                os.chmod(os.path.join(root, name), 0o755)
        os.chmod(scratch, 0o755)
        os.chown(home, 65534, 65534)
        prefix = ["setpriv", "--reuid=65534", "--regid=65534",
                  "--clear-groups"]
    # A fresh login's environment: no PYTHONPATH, no PAGEALLOC_LIBRARY;
    # pip offline (the suite has no network), as the doc's own words say
    # it needs none.
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
           "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_CACHE_DIR": "1"}
    if preload:
        env["LD_PRELOAD"] = preload
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    script = "set -euxo pipefail\n" + "\n".join(commands) + "\n"
    done = subprocess.run(prefix + ["/bin/bash", "-c", script], cwd=repo,
                          env=env, capture_output=True, text=True)
    print(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.exit("docs/python.md's install failed as %s (exit %d)" %
                 (who, done.returncode))
    assert "0.1.0 1.11" in done.stdout, done.stdout
    python = os.path.join(home, ".venvs", "pagealloc", "bin", "python")
    site = subprocess.run(
        prefix + [python, "-c", "import pagealloc, os; "
                  "print(os.path.dirname(os.path.dirname("
                  "pagealloc.LIBRARY_PATH)))"],
        env=env, cwd=home, capture_output=True, text=True, check=True)
    smoke(server, [python], site.stdout.strip(), scratch, env, prefix,
          "daemon-" + who)


def smoke(server, python, site, scratch, env, prefix, name):
    """Starts a daemon and runs SMOKE with `python`; exits on failure."""
    socket = os.path.join(scratch, name + ".sock")
    target = "unix://" + socket
    log = open(os.path.join(scratch, name + ".log"), "w")
    daemon = subprocess.Popen(
        [server, "--backend=cpu", "--num_pages=16", "--page_size=8",
         "--listen=" + target, "--metrics_host=127.0.0.1",
         "--metrics_port=0",
         # another user (nobody) connects to it
         "--socket_mode=0666"], stdout=log, stderr=subprocess.STDOUT)
    try:
        preload = sanitizer_preload(
            os.path.join(site, "pagealloc", "libpagealloc_client.so"))
        env = dict(env)
        if preload:
            env["LD_PRELOAD"] = preload
            env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + \
                ":detect_leaks=0"
        ran = subprocess.run(prefix + python + ["-c", SMOKE, site, target],
                             env=env, cwd=scratch)
    finally:
        daemon.terminate()
        daemon.wait(timeout=20)
        log.close()
    if ran.returncode != 0:
        with open(log.name) as f:
            sys.exit("the installed package failed; the daemon's log:\n" +
                     f.read())


def main():
    wheel, server, python_md = sys.argv[1], sys.argv[2], sys.argv[3]
    check_record(wheel)
    commands = doc_install_commands(python_md)
    scratch = tempfile.mkdtemp(prefix="pagealloc-wheel-", dir="/tmp")
    site = os.path.join(scratch, "site")
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_CACHE_DIR="1", HOME=scratch)
    env.pop("PAGEALLOC_LIBRARY", None)
    env.pop("PYTHONPATH", None)
    subprocess.run(["/usr/bin/python3", "-m", "pip", "install", "--no-index",
                    "--no-deps", "--target", site, wheel], check=True, env=env)
    env["PYTHONPATH"] = site
    smoke(server, ["/usr/bin/python3"], site, scratch, env, [], "daemon")
    preload = sanitizer_preload(
        os.path.join(site, "pagealloc", "libpagealloc_client.so"))
    run_doc_install(commands, wheel, server, scratch, as_user=False,
                    preload=preload)
    if os.geteuid() == 0:
        run_doc_install(commands, wheel, server, scratch, as_user=True,
                        preload=preload)
    shutil.rmtree(scratch)

if __name__ == "__main__":
    main()
