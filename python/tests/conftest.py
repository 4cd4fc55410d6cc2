"""Test fixtures: a real pagealloc-server on a private Unix socket.

The test wrapper (python/python_test.sh) sets PAGEALLOC_SERVER to the
daemon binary and PAGEALLOC_LIBRARY to libpagealloc_client.so. The backend
is the CPU one unless PAGEALLOC_TEST_BACKEND says otherwise ("cuda" on a GPU
host, where the same tests run against CUDA IPC rings).
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

import pagealloc

BACKEND = os.environ.get("PAGEALLOC_TEST_BACKEND", "cpu")


class Daemon:
    """A pagealloc-server process; `target` is its unix:// address."""

    def __init__(self, flags):
        binary = os.environ.get("PAGEALLOC_SERVER")
        if not binary:
            raise RuntimeError("PAGEALLOC_SERVER is not set")
        # Unix socket paths are limited to 107 bytes: a short directory.
        self.dir = tempfile.mkdtemp(prefix="pagealloc-py-", dir="/tmp")
        self.target = "unix://" + os.path.join(self.dir, "daemon.sock")
        log_dir = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR", self.dir)
        self.log_path = os.path.join(
            log_dir, "daemon-%s.log" % os.path.basename(self.dir))
        self._log = open(self.log_path, "w")
        self._argv = [binary, "--backend=" + BACKEND, "--listen=" + self.target,
                      "--metrics_host=127.0.0.1", "--metrics_port=0"]
        self.process = subprocess.Popen(
            self._argv + list(flags), stdout=self._log,
            stderr=subprocess.STDOUT)
        self._wait_until_serving()

    def _wait_until_serving(self, timeout_s=20.0):
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError("pagealloc-server exited at start:\n" +
                                   self.log())
            try:
                with pagealloc.Client.connect(self.target, name="probe",
                                              call_timeout=2.0):
                    return
            except pagealloc.UnavailableError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        "pagealloc-server did not answer within %.0f s:\n%s" %
                        (timeout_s, self.log()))
                time.sleep(0.05)

    def log(self):
        self._log.flush()
        with open(self.log_path) as f:
            return f.read()

    def connect(self, name="test", **kwargs):
        return pagealloc.Client.connect(self.target, name=name, **kwargs)

    def kill(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=20)

    def start_again(self, *flags):
        """Starts a fresh daemon (none of the old one's state) on the same
        socket, once this one is dead (kill)."""
        self.process = subprocess.Popen(
            self._argv + list(flags), stdout=self._log,
            stderr=subprocess.STDOUT)
        self._wait_until_serving()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def make_daemon():
    """Starts daemons with the given flags; stops them after the test."""
    started = []

    def make(*flags):
        daemon = Daemon(flags)
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.stop()


@pytest.fixture
def daemon(make_daemon):
    """A fresh daemon: 16 pages of 4 tokens, lifo."""
    return make_daemon("--num_pages=16", "--page_size=4")


def wait_until(condition, timeout_s=20.0, what="the condition"):
    """Polls `condition` until it is true; fails the test after the bound."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out after %.0f s waiting for %s" %
                        (timeout_s, what))
        time.sleep(0.02)
