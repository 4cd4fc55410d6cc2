"""Resumable sessions, Client.resume and reconnect, through the package
against a real daemon: a resumable session outlives its process and is
taken back with its pages; hostile resumes are refused; take_over tells the
old client; a client whose daemon restarts without its state is told the
session is gone; without reconnect a dead daemon ends the session as
before."""

import os
import selectors
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pagealloc
from conftest import wait_until

PAGE_SIZE = 4

# A scheduler process: registers a resumable session, allocates two pages,
# prints its id, token and pages, then runs until it is killed.
_SCHEDULER = textwrap.dedent("""
    import sys
    import time
    import pagealloc
    client = pagealloc.Client.connect(sys.argv[1], name="scheduler",
                                      resumable=True)
    allocation = client.alloc([8], return_inline=True).check()
    pages = sorted({int(s) // %d for s in allocation[0].slots})
    print(client.session_id, client.session_token.hex(),
          ",".join(str(p) for p in pages), flush=True)
    time.sleep(600)
""" % PAGE_SIZE)


def _read_line(process, timeout_s=30.0):
    """The first line `process` prints, waiting at most `timeout_s`."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            pytest.fail("the scheduler printed nothing within %.0f s" %
                        timeout_s)
    return process.stdout.readline().decode()


def _pages_of(allocation):
    return sorted({int(s) // PAGE_SIZE for s in allocation[0].slots})


def test_a_resumable_session_survives_its_process_death(daemon):
    scheduler = subprocess.Popen(
        [sys.executable, "-c", _SCHEDULER, daemon.target],
        stdout=subprocess.PIPE, env=dict(os.environ))
    try:
        session_id, token_hex, pages = _read_line(scheduler).split()
    finally:
        scheduler.kill()
        scheduler.wait(timeout=20)
    session_id = int(session_id)
    token = bytes.fromhex(token_hex)
    pages = [int(p) for p in pages.split(",")]
    resumed = []

    def resume():
        try:
            resumed.append(
                pagealloc.Client.resume(daemon.target, session_id, token))
            return True
        except pagealloc.FailedPreconditionError:
            return False  # the daemon has not seen the process die yet

    wait_until(resume, what="the killed scheduler's session to be kept")
    client = resumed[0]
    assert client.session_id == session_id
    assert client.resumable
    with daemon.connect("probe") as probe:
        assert probe.stats().used_pages == 2
        assert client.free_pages(pages) == 2
        stats = probe.stats()
        assert stats.used_pages == 0
        assert stats.free_pages == stats.pool.num_pages
    # The fresh ring serves ring results.
    with client.alloc([4]) as allocation:
        allocation.check()
        assert allocation.link_epoch == 0
    client.close()


def test_detach_leaves_the_session_for_resume(daemon):
    first = daemon.connect("first", resumable=True)
    assert first.resumable
    pages = _pages_of(first.alloc([8], return_inline=True).check())
    session_id, token = first.session_id, first.session_token
    first.detach()
    assert isinstance(first.session_status(),
                      pagealloc.FailedPreconditionError)
    with pytest.raises(pagealloc.FailedPreconditionError, match="detached"):
        first.alloc([4])
    del first  # leaves the session alone
    second = pagealloc.Client.resume(daemon.target, session_id, token)
    assert second.free_pages(pages) == 2
    plain = daemon.connect("plain")
    assert not plain.resumable
    with pytest.raises(pagealloc.FailedPreconditionError,
                       match="not resumable"):
        plain.detach()
    assert plain.alive
    second.close()
    plain.close()


def test_hostile_resumes_are_refused_and_take_over_tells_the_old_client(
        daemon):
    owner = daemon.connect("owner", resumable=True)
    pages = _pages_of(owner.alloc([4], return_inline=True).check())
    token = owner.session_token
    wrong = bytes([token[0] ^ 1]) + token[1:]
    with pytest.raises(pagealloc.UnauthenticatedError,
                       match="wrong session_token"):
        pagealloc.Client.resume(daemon.target, owner.session_id, wrong)
    with pytest.raises(pagealloc.NotFoundError,
                       match="unknown or has expired"):
        pagealloc.Client.resume(daemon.target, owner.session_id + 999, token)
    with pytest.raises(pagealloc.FailedPreconditionError,
                       match="is still connected"):
        pagealloc.Client.resume(daemon.target, owner.session_id, token)
    assert owner.alive
    with daemon.connect("probe") as probe:
        assert probe.stats().used_pages == 1

    taker = pagealloc.Client.resume(daemon.target, owner.session_id, token,
                                    take_over=True)
    wait_until(lambda: not owner.alive, what="the old client to be told")
    assert isinstance(owner.session_status(), pagealloc.AbortedError)
    assert "taken over" in str(owner.session_status())
    with pytest.raises(pagealloc.AbortedError):
        owner.alloc([4])
    owner.close()  # the session is the taker's: nothing is closed
    assert taker.free_pages(pages) == 1
    taker.close()

    # A session that was not resumable is gone with its connection.
    plain = daemon.connect("plain")
    plain_id, plain_token = plain.session_id, plain.session_token
    plain.close()
    with pytest.raises(pagealloc.NotFoundError):
        pagealloc.Client.resume(daemon.target, plain_id, plain_token)


def test_reconnect_to_a_daemon_without_state_says_the_session_is_gone(
        make_daemon):
    flags = ("--num_pages=16", "--page_size=%d" % PAGE_SIZE)
    daemon = make_daemon(*flags)
    client = daemon.connect("reconnects", reconnect_timeout=60,
                            reconnect_backoff=(0.01, 0.2))
    allocation = client.alloc([8]).check()
    slots = np.array(allocation.slots, copy=True)
    daemon.kill()
    wait_until(lambda: client.reconnecting, what="the reconnect to start")
    assert client.alive
    daemon.start_again(*flags)
    wait_until(lambda: not client.alive, timeout_s=60,
               what="the reconnect's outcome")
    status = client.session_status()
    assert isinstance(status, pagealloc.NotFoundError), status
    assert ("session gone: the daemon restarted without this session's "
            "state") in str(status)
    assert not client.reconnecting
    assert client.link_epoch == 0
    # The old ring stays mapped: the slots read what the dead daemon wrote.
    assert np.array_equal(np.array(allocation.slots), slots)


def test_without_reconnect_a_dead_daemon_ends_the_session(daemon):
    client = daemon.connect("plain")
    daemon.kill()
    wait_until(lambda: not client.alive, what="the session to end")
    status = client.session_status()
    assert isinstance(status, pagealloc.UnavailableError), status
    assert "the daemon went away" in str(status)
    assert not client.reconnecting


def test_a_kept_pool_comes_back_with_the_sessions_pages(make_daemon):
    # No service manager: the daemon's descriptor keeper holds the pool for
    # the successor started with --take_over.
    flags = ("--num_pages=16", "--page_size=%d" % PAGE_SIZE, "--keep_state",
             "--fd_keeper_linger_ms=2000")
    daemon = make_daemon(*flags)
    client = daemon.connect("kept", resumable=True, reconnect_timeout=60,
                            reconnect_backoff=(0.01, 0.2))
    pages = _pages_of(client.alloc([8], return_inline=True).check())
    assert list(client.list_pages()) == pages
    # The keeper starts beside the daemon; a kill before it listens would
    # leave no successor a pool to take.
    wait_until(lambda: "descriptor keeper pid" in daemon.log(),
               what="the descriptor keeper to hold the pool")
    daemon.kill()
    wait_until(lambda: client.reconnecting, what="the reconnect to start")
    daemon.start_again(*(flags + ("--take_over",)))
    wait_until(lambda: client.link_epoch == 1, timeout_s=60,
               what="the reconnect to the successor")
    assert client.alive
    # The session's pages as the successor has them, and nothing was in
    # flight to send again.
    assert list(client.list_pages()) == pages
    assert client.calls_sent_again == 0
    assert client.free_pages(pages) == 2
    assert client.list_pages().size == 0
    client.close()
