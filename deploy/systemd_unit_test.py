#!/usr/bin/python3
"""Checks deploy/systemd/pagealloc@.service and its example environment file.

1. The unit has the settings docs/operations.md promises (user, socket
   directory, hardening, device access, restart policy, environment file).
2. `systemd-analyze verify` accepts it with no warning, for two instances.
   verify needs no running systemd, but it requires ExecStart's binary to
   exist, so we verify a copy whose ExecStart names the binary Bazel built;
   everything else is the committed text. A copy with a misspelt key must
   draw a warning, which shows the check sees warnings here at all.
3. The install steps in the unit's header comment run, in order, under a
   scratch root (every absolute path moved under it; useradd and
   systemctl, which need a real system, left out), and leave the files
   where the unit expects them, its Documentation= file included.
4. The ExecStart line, expanded the way systemd expands it (%i, ${VAR},
   $VAR split at whitespace) with the example environment file, runs the real
   pagealloc-server: it starts, serves /healthz and stops cleanly on SIGTERM.
   Only what cannot work in a test sandbox is overridden (the socket path,
   the group, the GPU backend, the metrics port), by flags appended after the
   unit's (Abseil flags: the last occurrence wins).
"""

import array
import grp
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

UNIT = "deploy/systemd/pagealloc@.service"
ENV_EXAMPLE = "deploy/systemd/gpu.env.example"
OPERATIONS = "docs/operations.md"
BINARY_IN_UNIT = "/usr/local/bin/pagealloc-server"

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def parse_unit(text):
    """Returns {section: [(key, value), ...]} (keys may repeat)."""
    sections = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            sections.setdefault(current, [])
            continue
        key, _, value = line.partition("=")
        sections[current].append((key.strip(), value.strip()))
    return sections


def values(sections, section, key):
    return [v for k, v in sections.get(section, []) if k == key]


def parse_env_file(path):
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def expand_exec(line, instance, env):
    """Expands an ExecStart line as systemd does for our unit's constructs."""
    words = []
    for word in shlex.split(line.replace("%i", instance)):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:  # $VAR alone: split at whitespace, nothing when empty
            words.extend(env.get(whole.group(1), "").split())
            continue
        words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                            lambda m: env.get(m.group(1), ""), word))
    return words


def check_settings(sections):
    s = "Service"
    expect = {
        "User": "pagealloc",
        "Group": "pagealloc",
        "RuntimeDirectory": "pagealloc",
        "RuntimeDirectoryPreserve": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "Restart": "on-failure",
        "Type": "notify",
        "NotifyAccess": "main",
        "DevicePolicy": "closed",
        "EnvironmentFile": "-/etc/pagealloc/gpu%i.env",
    }
    for key, want in expect.items():
        got = values(sections, s, key)
        check(got == [want], f"[Service] {key}: want {want!r}, got {got}")
    store = values(sections, s, "FileDescriptorStoreMax")
    check(len(store) == 1 and int(store[0]) >= 2,
          f"FileDescriptorStoreMax must hold the slab and the state: {store}")
    check(values(sections, s, "PrivateDevices") in ([], ["no"]),
          "PrivateDevices would hide /dev/nvidia*")
    allowed = {v.split()[0]: v.split()[1] for v in
               values(sections, s, "DeviceAllow")}
    for group in ("char-nvidia", "char-nvidiactl", "char-nvidia-uvm"):
        check("rw" in allowed.get(group, ""),
              f"DeviceAllow lacks {group} rw (CUDA opens it): {allowed}")
    exec_start = values(sections, s, "ExecStart")
    check(len(exec_start) == 1, f"one ExecStart, got {exec_start}")
    argv = shlex.split(exec_start[0])
    check(argv[0] == BINARY_IN_UNIT, f"ExecStart runs {argv[0]}")
    for flag in ("--gpu=%i", "--listen=unix:///run/pagealloc/gpu%i.sock",
                 "--metrics_host=${PAGEALLOC_METRICS_HOST}",
                 "--metrics_port=${PAGEALLOC_METRICS_PORT}", "--keep_state"):
        check(flag in argv, f"ExecStart lacks {flag}: {argv}")
    check("PAGEALLOC_METRICS_HOST=0.0.0.0" in values(sections, s, "Environment"),
          "the unit does not set PAGEALLOC_METRICS_HOST=0.0.0.0 (the daemon "
          "defaults to loopback, which a remote Prometheus cannot scrape)")
    check("WantedBy" in dict(sections.get("Install", [])),
          "no [Install] WantedBy: systemctl enable would do nothing")


def verify(unit_text, binary, workdir):
    """Runs systemd-analyze verify on instances 0 and 7 of `unit_text`."""
    os.makedirs(workdir)
    with open(os.path.join(workdir, "pagealloc@.service"), "w") as f:
        f.write(unit_text.replace(BINARY_IN_UNIT, binary))
    env = dict(os.environ, SYSTEMD_LOG_LEVEL="notice", SYSTEMD_PAGER="")
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no",
         os.path.join(workdir, "pagealloc@0.service"),
         os.path.join(workdir, "pagealloc@7.service")],
        capture_output=True, text=True, env=env, timeout=120)
    return result.returncode, result.stdout + result.stderr


def run_install_steps(unit_text, server_binary, tmp):
    """Runs the header's `install` lines under a scratch root."""
    root = os.path.join(tmp, "root")
    source = os.path.join(tmp, "source")
    os.makedirs(source)
    shutil.copy(server_binary, os.path.join(source, "pagealloc-server"))
    shutil.copy(UNIT, os.path.join(source, "pagealloc@.service"))
    shutil.copy(ENV_EXAMPLE, os.path.join(source, "gpu.env.example"))
    shutil.copy(OPERATIONS, os.path.join(source, "operations.md"))
    for directory in ("usr/local/bin", "etc/systemd/system"):
        os.makedirs(os.path.join(root, directory))  # a real system has these
    steps = []
    for line in unit_text.splitlines():
        if not line.startswith("#"):
            break
        command = line.lstrip("# ").split("  #")[0].strip()
        if command.startswith("install "):
            steps.append(command)
    check(any("/etc/pagealloc/gpu1.env" in s for s in steps),
          f"the header installs no environment file: {steps}")
    for step in steps:
        words = [root + w if w.startswith("/") else w
                 for w in shlex.split(step)]
        result = subprocess.run(words, cwd=source, capture_output=True,
                                text=True)
        check(result.returncode == 0,
              f"header step failed: {step}: {result.stderr.strip()}")
    # Every file:// Documentation= of the unit is one the steps install.
    documentation = [d[len("file://"):] for d in
                     values(parse_unit(unit_text), "Unit", "Documentation")
                     if d.startswith("file://")]
    check(documentation, "the unit names no Documentation= file")
    for path in ["usr/local/bin/pagealloc-server",
                 "etc/systemd/system/pagealloc@.service",
                 "etc/pagealloc/gpu1.env"] + [d.lstrip("/")
                                             for d in documentation]:
        check(os.path.isfile(os.path.join(root, path)),
              f"the header's steps did not install /{path}")


def receive_notifications(notify):
    """Every notification waiting on the manager's socket: (text, fds)."""
    got = []
    while True:
        try:
            data, ancdata, _, _ = notify.recvmsg(
                4096, socket.CMSG_SPACE(16 * array.array("i").itemsize),
                socket.MSG_DONTWAIT)
        except BlockingIOError:
            return got
        fds = array.array("i")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        got.append((data.decode(), list(fds)))


def run_expanded(argv, tmp):
    # A short path for the sockets (TEST_TMPDIR is too long for one),
    # removed at the end whatever the server left there.
    sock_dir = tempfile.mkdtemp(prefix="pagealloc-unit-", dir="/tmp")
    try:
        run_expanded_in(argv, tmp, sock_dir)
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def run_expanded_in(argv, tmp, sock_dir):
    socket_path = os.path.join(sock_dir, "gpu3.sock")
    argv = argv + [
        "--listen=unix://" + socket_path,
        "--socket_group=" + grp.getgrgid(os.getgid()).gr_name,
        "--backend=cpu", "--metrics_port=0", "--metrics_host=127.0.0.1"]
    # Type=notify with --keep_state: systemd's side of the protocol, a
    # datagram socket named by $NOTIFY_SOCKET.
    notify_path = os.path.join(sock_dir, "notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    env = dict(os.environ, NOTIFY_SOCKET=notify_path)
    log_path = os.path.join(tmp, "server.log")
    with open(log_path, "w") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                  env=env)
    port = None
    messages = []
    deadline = time.time() + 30
    while time.time() < deadline and server.poll() is None:
        messages += receive_notifications(notify)
        match = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/",
                          open(log_path).read())
        ready = any("READY=1" in text.split("\n") for text, _ in messages)
        if match and os.path.exists(socket_path) and ready:
            port = int(match.group(1))
            break
        time.sleep(0.05)
    log_text = lambda: open(log_path).read()
    if port is None:
        server.kill()
        server.wait()
        check(False, f"server with the unit's flags did not start and say "
              f"READY=1: {argv}\nnotifications: {messages}\n" + log_text())
        return
    stored = [text for text, fds in messages
              if "FDSTORE=1" in text.split("\n") and len(fds) == 1]
    check(any("FDNAME=pagealloc-state" in text for text in stored),
          f"--keep_state stored no state journal: {messages}")
    for _, fds in messages:
        for fd in fds:
            os.close(fd)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz",
                                timeout=5) as response:
        check(response.status == 200, f"/healthz answered {response.status}")
    check(oct(os.stat(socket_path).st_mode & 0o777) == "0o660",
          "socket mode is not 0660")
    server.send_signal(signal.SIGTERM)
    code = server.wait(timeout=30)
    check(code == 0, f"SIGTERM: exit {code}, want 0 (no restart by "
          "Restart=on-failure)\n" + log_text())
    check(not os.path.exists(socket_path), "socket left after SIGTERM")
    notify.close()


def main():
    server_binary = os.path.abspath(sys.argv[1])
    tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
    unit_text = open(UNIT).read()
    sections = parse_unit(unit_text)
    check_settings(sections)

    run_install_steps(unit_text, server_binary, tmp)

    code, output = verify(unit_text, server_binary,
                          os.path.join(tmp, "verify"))
    check(code == 0 and output.strip() == "",
          f"systemd-analyze verify: exit {code}, output:\n{output}")
    # Negative control: a misspelt key is a warning (exit 0) in systemd 252;
    # the check above must see it.
    code, output = verify(unit_text.replace("ProtectHome=", "ProtectHom="),
                          server_binary, os.path.join(tmp, "verify-bad"))
    check("ProtectHom" in output,
          "systemd-analyze verify did not flag a misspelt key; the check "
          f"above proves nothing (exit {code}, output {output!r})")

    env = {k: v for k, v in (kv.split("=", 1) for kv in
                             values(sections, "Service", "Environment"))}
    env.update(parse_env_file(ENV_EXAMPLE))
    check(env.get("PAGEALLOC_METRICS_PORT") == "9464",
          "the example env file is GPU 0's: port 9464")
    env["PAGEALLOC_METRICS_PORT"] = "9467"  # as gpu3.env would say
    argv = expand_exec(values(sections, "Service", "ExecStart")[0], "3", env)
    for flag in ("--gpu=3", "--listen=unix:///run/pagealloc/gpu3.sock",
                 "--metrics_host=0.0.0.0", "--metrics_port=9467",
                 "--page_size=16"):
        check(flag in argv, f"expanded ExecStart lacks {flag}: {argv}")
    argv[0] = server_binary
    run_expanded(argv, tmp)

    for failure in failures:
        print("FAIL:", failure)
    if failures:
        return 1
    print("OK: unit verified; expanded ExecStart served and stopped cleanly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
