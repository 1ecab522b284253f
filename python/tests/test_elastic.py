"""ElasticPeerSet over a real directory and transport: picks, sends, a transport death event,
mark_failed, draining; and examples/mobile_endpoints.py's six lines."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

import connex
from connex import Lid, transport
from connex.directory import DirectoryClient
from connex.elastic import ElasticPeerSet, MessageInbox, PeerChangeKind, PeerState

from conftest import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]


def replica(server, fabric, lid):
    client = DirectoryClient(server.bind_addr, rejoin_after_eviction=False)
    client.start()
    engine = transport.mem(lid, fabric)
    inbox = MessageInbox()
    epoch = client.join(lid, [inbox.address] + engine.local_addresses)
    return client, engine, inbox, epoch


def test_peer_set_follows_the_group(server):
    fabric = transport.Fabric()
    a_client, a_engine, a_inbox, a_epoch = replica(server, fabric, Lid("demo", 1, 0, 0))
    b_client, b_engine, b_inbox, b_epoch = replica(server, fabric, Lid("demo", 1, 0, 1))
    owner = DirectoryClient(server.bind_addr, "demo", stage_idx=0, replica_idx=1)
    owner.start()
    owner.register(addresses=["tcp://127.0.0.1:9"])
    owner_engine = transport.mem(("demo", 0, 0, 1), fabric)
    peers = ElasticPeerSet(owner, owner_engine, stage_idx=1, send_timeout_ms=300)
    changes = []
    peers.on_change(changes.append)
    peers.start()
    with pytest.raises(connex.Fenced):
        peers.start()  # once
    assert peers.wait_ready(2, timeout=5)
    assert peers.peer_lids() == [("demo", 1, 0, 0), ("demo", 1, 0, 1)]
    assert peers.pick() == ("demo", 1, 0, 1)  # the owner's own replica first
    assert peers.pick(current=("demo", 1, 0, 0)) == ("demo", 1, 0, 0)  # sticky
    assert peers.state_of("demo/g1/s0/r0", a_epoch) == PeerState.LIVE
    assert str(PeerState.DRAINING) == "draining"

    peers.send(("demo", 1, 0, 0), b"hello")
    assert a_inbox.receive(timeout=3) == b"hello"
    peers.send("demo/g1/s0/r0", memoryview(bytearray(b"any buffer")))
    assert a_inbox.receive(timeout=3) == b"any buffer"
    with pytest.raises(TypeError):
        peers.send(("demo", 1, 0, 0), "a str is not bytes")

    # Replica 1 dies: the transport's event evicts it, in a callback with the GIL.
    assert wait_until(lambda: peers.stats["watches"] >= 2)
    b_inbox.stop()
    b_engine.close()
    b_client.close()
    assert wait_until(lambda: peers.peer_lids() == [Lid("demo", 1, 0, 0)])
    # The change reaches Python on the peer set's thread once it has the GIL: maybe after the
    # list above changed (a loaded machine: `.ci/run` saw the list first).
    assert wait_until(lambda: any(c.kind == PeerChangeKind.FAILED for c in changes))
    failed = [c for c in changes if c.kind == PeerChangeKind.FAILED]
    assert failed and failed[0].lid == ("demo", 1, 0, 1) and failed[0].local
    assert "transport" in failed[0].reason
    assert peers.pick() == ("demo", 1, 0, 0)  # handed over
    with pytest.raises(connex.Unavailable):
        peers.send(("demo", 1, 0, 1), b"lost")

    # mark_failed of an unknown incarnation, and of a live one.
    with pytest.raises(connex.NotFound):
        peers.mark_failed(("demo", 1, 0, 7))
    peers.mark_failed(("demo", 1, 0, 0))
    assert peers.peer_lids() == []
    with pytest.raises(connex.Unavailable):
        peers.pick()
    peers.close()
    for c in (a_client, owner):
        c.close()
    for e in (a_engine, owner_engine):
        e.close()


def test_draining_after_leave(server):
    fabric = transport.Fabric()
    a_client, a_engine, a_inbox, a_epoch = replica(server, fabric, Lid("demo", 1, 0, 0))
    owner = DirectoryClient(server.bind_addr, "demo")
    owner.start()
    with ElasticPeerSet(owner, None, 1) as peers:  # directory events only
        peers.start()
        assert peers.wait_ready(1)
        a_client.leave(("demo", 1, 0, 0))
        assert wait_until(lambda: peers.peer_lids() == [])
        assert peers.state_of(("demo", 1, 0, 0), a_epoch) == PeerState.DRAINING
        assert [m.state for m in peers.members()] == [PeerState.DRAINING]


@pytest.mark.parametrize("backend", ["mem", "tcp"])
def test_mobile_endpoints_example_prints_the_six_lines(backend):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "mobile_endpoints.py"), "--backend", backend],
        capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "replicas", "received", "handover", "rejoin", "migrate", "scale-down"]
    assert lines[0] == "replicas:   [demo/g1/s0/r0, demo/g1/s0/r1]"
    assert lines[1] == "received:   step step"
    assert re.match(r"handover:   \[demo/g1/s0/r0\] step-42 \(demo/g1/s0/r1 evicted by \S+", lines[2])
    assert re.match(r"rejoin:     \[demo/g1/s0/r0, demo/g1/s0/r1\] \(demo/g1/s0/r1 epoch \d+ -> \d+\)",
                    lines[3])
    assert re.match(r"migrate:    after-migrate \(demo/g1/s0/r0 epoch \d+ -> \d+, now at zmq\+tcp://",
                    lines[4])
    assert lines[5] == "scale-down: [demo/g1/s0/r0] (demo/g1/s0/r1 draining)"
