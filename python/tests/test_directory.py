"""A directory server with clients that join, watch and receive membership events, as
callbacks (also while another thread holds the GIL) and as an iterator."""

import sys
import threading
import time

import pytest

import connex
from connex import Lid
from connex.directory import DirectoryClient, EventKind

from conftest import wait_until


def test_server_addresses(server):
    assert server.running
    assert server.bind_addr.startswith("tcp://127.0.0.1:")
    assert server.pub_addr.startswith("tcp://127.0.0.1:")
    assert server.bind_addr != server.pub_addr


def test_two_clients_join_and_a_watcher_sees_them(server):
    a = DirectoryClient(server.bind_addr, "demo", stage_idx=1, replica_idx=0,
                        local_addresses=["tcp://127.0.0.1:5000"])
    b = DirectoryClient(server.bind_addr, "demo", stage_idx=1, replica_idx=1,
                        local_addresses=["tcp://127.0.0.1:5001"])
    a.start()
    b.start()
    watcher = DirectoryClient(server.bind_addr)
    watcher.start()
    watcher.watch("demo")
    events = watcher.events("demo")

    epoch_a = a.register()
    epoch_b = b.register()
    assert epoch_b > epoch_a > 0
    assert a.lid == ("demo", 1, 0, 0)
    assert a.epoch_of(a.lid) == epoch_a
    assert a.renew(a.lid) == epoch_a

    assert watcher.await_view("demo", 2, timeout=5)
    view = watcher.view("demo", 1)
    assert [r.lid for r in view] == [Lid("demo", 1, 0, 0), Lid("demo", 1, 0, 1)]
    assert [r.epoch for r in view] == [epoch_a, epoch_b]
    assert view[1].addresses == ["tcp://127.0.0.1:5001"]

    record = watcher.resolve("demo/g1/s0/r1")
    assert record.epoch == epoch_b and record.addresses == ["tcp://127.0.0.1:5001"]
    snap = watcher.get_snapshot("demo")
    assert len(snap) == 2 and snap.revision >= 2

    first = events.get(timeout=5)
    second = events.get(timeout=5)
    assert (first.kind, first.lid, first.epoch) == (EventKind.JOINED, a.lid, epoch_a)
    assert (second.kind, second.lid) == (EventKind.JOINED, b.lid)

    # Migration: same LID, new addresses, new epoch.
    new_epoch = a.register(addresses=["tcp://127.0.0.1:6000"])
    migrated = events.get(timeout=5)
    assert migrated.kind == EventKind.MIGRATED
    assert (migrated.previous_epoch, migrated.epoch) == (epoch_a, new_epoch)

    # Scale down, and the iterator form.
    b.deregister()
    left = next(iter(events))
    assert (left.kind, left.lid) == (EventKind.LEFT, b.lid)
    assert wait_until(lambda: len(watcher.view("demo")) == 1)
    events.close()
    assert list(events) == []
    assert events.get(timeout=0.01) is None

    # Another process cannot take a live LID.
    c = DirectoryClient(server.bind_addr, join_waits_for_lease=False)
    c.start()
    with pytest.raises(connex.AlreadyExists):
        c.join(("demo", 1, 0, 0), ["tcp://127.0.0.1:7000"])
    for client in (a, b, c, watcher):
        client.close()


def test_fenced_after_eviction(server):
    holder = DirectoryClient(server.bind_addr, rejoin_after_eviction=False)
    holder.start()
    lid = ("demo", 2, 0, 0)
    epoch = holder.join(lid, ["tcp://127.0.0.1:5000"])
    reporter = DirectoryClient(server.bind_addr)
    reporter.start()
    reporter.join(("demo", 0, 0, 0), ["tcp://127.0.0.1:5001"])  # a member may report
    assert reporter.report_failed(lid, epoch, "test") is True
    with pytest.raises(connex.Fenced, match="demo/g2/s0/r0.*evicted") as info:
        holder.renew(lid)  # a zombie learns it was fenced
    assert info.value.code == "FAILED_PRECONDITION"
    holder.close()
    reporter.close()


def test_callback_receives_events_while_another_thread_holds_the_gil(server):
    watcher = DirectoryClient(server.bind_addr)
    watcher.start()
    watcher.watch("demo")
    got = []
    callback_threads = set()

    def on_event(event):
        callback_threads.add(threading.get_ident())
        got.append((event.kind, event.lid))

    sub = watcher.subscribe(on_event)
    holder = DirectoryClient(server.bind_addr)
    holder.start()

    # A Python thread that never sleeps nor blocks: it keeps the GIL but for the interpreter's
    # switch interval. The events of the joins below still reach the callback.
    stop = threading.Event()
    spins = [0]

    def spin():
        while not stop.is_set():
            spins[0] += 1

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        for r in range(3):
            holder.join(("demo", 1, 0, r), [f"tcp://127.0.0.1:{5000 + r}"])
        # The main thread also busy-waits, holding the GIL whenever it runs.
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            pass
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(old_interval)
    assert got == [(EventKind.JOINED, Lid("demo", 1, 0, r)) for r in range(3)]
    assert threading.get_ident() not in callback_threads  # the client's own thread
    assert spins[0] > 0

    watcher.unsubscribe(sub)
    later = []
    watcher.subscribe(later.append)  # called after `sub` would have been, on the same thread
    holder.leave(("demo", 1, 0, 0))
    assert wait_until(lambda: later)
    assert len(got) == 3  # unsubscribed: no more calls
    with pytest.raises(connex.NotFound):
        watcher.unsubscribe(sub)
    holder.close()
    watcher.close()


def test_callback_exception_goes_to_unraisablehook(server, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    watcher = DirectoryClient(server.bind_addr)
    watcher.start()
    watcher.watch("demo")
    calls = []

    def bad(event):
        calls.append(event)
        raise RuntimeError("callback failed")

    watcher.subscribe(bad)
    holder = DirectoryClient(server.bind_addr)
    holder.start()
    holder.join(("demo", 1, 0, 0), ["tcp://127.0.0.1:5000"])
    holder.join(("demo", 1, 0, 1), ["tcp://127.0.0.1:5001"])
    assert wait_until(lambda: len(calls) == 2)  # the client goes on after an exception
    assert wait_until(lambda: len(seen) == 2)
    assert all(isinstance(e, RuntimeError) for e in seen)
    holder.close()
    watcher.close()


def test_registration_change_callback(server):
    holder = DirectoryClient(server.bind_addr, heartbeat_ms=100)
    holder.start()
    changes = []
    holder.on_registration_change(changes.append)
    lid = ("demo", 3, 0, 0)
    epoch = holder.join(lid, ["tcp://127.0.0.1:5000"])
    reporter = DirectoryClient(server.bind_addr)
    reporter.start()
    reporter.join(("demo", 0, 0, 0), ["tcp://127.0.0.1:5001"])
    reporter.report_failed(lid, epoch)
    # The holder learns of its eviction on its next heartbeat and joins again.
    assert wait_until(lambda: changes, timeout=5)
    assert changes[0].lid == lid and changes[0].old_epoch == epoch
    assert changes[0].ok and changes[0].new_epoch > epoch
    holder.on_registration_change(None)
    holder.close()
    reporter.close()


def test_a_python_thread_holding_the_gil_delays_callbacks_not_heartbeats():
    """The client's loop thread, which heartbeats, never waits for the GIL: callbacks run on a
    dispatcher thread of their own. A C call that keeps the GIL for 2 lease TTLs neither
    expires the lease of a client with a Python callback nor loses the event, which comes after."""
    import ctypes

    from connex.directory_server import DirectoryServer

    libc = ctypes.PyDLL("libc.so.6")  # PyDLL: calls keep the GIL
    with DirectoryServer(lease_ttl_ms=1000, heartbeat_ms=200) as server:
        holder = DirectoryClient(server.bind_addr)
        holder.start()
        holder.watch("demo")
        got = []
        holder.subscribe(lambda e: got.append((e.kind, e.lid)))
        epoch = holder.join(("demo", 1, 0, 0), ["tcp://127.0.0.1:5000"])
        assert wait_until(lambda: len(got) == 1)
        other = DirectoryClient(server.bind_addr)
        other.start()
        other.join(("demo", 1, 0, 1), ["tcp://127.0.0.1:5001"])
        libc.usleep(2_000_000)  # the GIL is held: no callback can run meanwhile
        assert wait_until(lambda: len(got) >= 2)
        assert got == [(EventKind.JOINED, Lid("demo", 1, 0, 0)),
                       (EventKind.JOINED, Lid("demo", 1, 0, 1))]  # no FAILED
        assert holder.renew(("demo", 1, 0, 0)) == epoch  # still the same incarnation
        holder.close()
        other.close()
