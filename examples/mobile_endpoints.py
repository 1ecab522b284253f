#!/usr/bin/env python3
"""mobile_endpoints: the scenario of the reference README's "Core abstractions" section, through
the Python API (the C++ twin is examples/mobile_endpoints.cc and prints the same six lines).

A sender talks to two replicas of one logical group through the directory (never fixed ranks),
survives one of them dying with a step in flight, sees it rejoin, follows a migration to a new
address, and a scale-down. Every endpoint has a transfer engine whose address it publishes, and
the peer set watches the replicas through the sender's engine, so a dead replica is evicted by
the transport's peer-death event rather than by a send timeout or its lease.

    PYTHONPATH=build/python python3 examples/mobile_endpoints.py [--directory tcp://HOST:PORT]
        [--backend mem|tcp|shm|ucx|auto]   (default: an embedded directory, the mem transport)
"""

import argparse
import os
import sys
import threading
import time

import connex
from connex import Lid, transport
from connex.directory import DirectoryClient
from connex.directory_server import DirectoryServer
from connex.elastic import ElasticPeerSet, MessageInbox, PeerChangeKind


def die(what, error):
    print(f"mobile_endpoints: {what}: {error}", file=sys.stderr)
    sys.exit(1)


def wait_until(predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def listing(lids):
    return "[" + ", ".join(str(lid) for lid in lids) + "]"


class Replica:
    """One replica endpoint of group 1: its own directory client, transport and message inbox,
    as its own process would have them."""

    def __init__(self, directory, make_transport, lid):
        # Evicted means dead here: a new process comes instead.
        self.client = DirectoryClient(directory, rejoin_after_eviction=False)
        self.client.start()
        self.engine = make_transport(lid)
        self.inbox = MessageInbox()
        self.epoch = self.client.join(lid, [self.inbox.address] + self.engine.local_addresses)


def receive(inbox):
    message = inbox.receive(timeout=3)
    if message is None:
        die("receive", "no message within 3 s")
    return message.decode()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--directory", default=os.environ.get("CONNEX_DIRECTORY", ""),
                        help="use this directory instead of an embedded one")
    parser.add_argument("--backend", default=os.environ.get("CONNEX_PP_BACKEND", "mem"),
                        choices=["mem", "tcp", "shm", "ucx", "auto"],
                        help="transport of every endpoint")
    parser.add_argument("--log-level", default=os.environ.get("CONNEX_LOG_LEVEL", "warn"),
                        help="trace, debug, info, warn, error or off")
    args = parser.parse_args()
    connex.set_log_level(args.log_level)

    directory = args.directory
    server = None
    if not directory:
        server = DirectoryServer("127.0.0.1:0", "127.0.0.1:0")
        server.start()
        directory = server.bind_addr

    fabric = transport.Fabric() if args.backend == "mem" else None

    def make_transport(lid):
        return transport.create_transfer_engine(args.backend, lid, fabric=fabric)

    lid_a = Lid("demo", 1, 0, 0)
    lid_b = Lid("demo", 1, 0, 1)
    # Each replica joins under LID ("demo", group=1, shard=0, replica=r).
    a = Replica(directory, make_transport, lid_a)
    b = Replica(directory, make_transport, lid_b)

    # The sender resolves the group through the directory and watches it through its transport.
    # It is a member of the model (stage 0, the owner): only members may report failures.
    owner = DirectoryClient(directory, "demo", stage_idx=0)
    owner.start()
    owner_inbox = MessageInbox()
    owner.register(addresses=[owner_inbox.address])
    owner_transport = make_transport(Lid("demo", 0, 0, 0))
    peers = ElasticPeerSet(owner, owner_transport, stage_idx=1, own_replica=0,
                           send_timeout_ms=200, reporter="owner")
    lock = threading.Lock()
    failure = []  # why replica 1 was evicted, from the change callback

    def on_change(change):
        if change.kind == PeerChangeKind.FAILED and change.record.lid == lid_b:
            with lock:
                failure.append(change.reason)

    peers.on_change(on_change)
    peers.start()
    if not peers.wait_ready(2, timeout=5):
        die("wait", "2 replicas not seen")
    if not wait_until(lambda: peers.stats["watches"] >= 2, 5):
        die("watch", "the transport did not connect to both replicas")
    print(f"replicas:   {listing(peers.peer_lids())}")

    for lid in peers.peer_lids():
        peers.send(lid, b"step")
    got_a = receive(a.inbox)
    got_b = receive(b.inbox)
    print(f"received:   {got_a} {got_b}")

    # Replica 1's process dies (no LEAVE) while the next step is addressed to it: its inbox, its
    # transport (the connection the sender watches closes) and its heartbeats stop.
    b.inbox.stop()
    start = time.monotonic()  # the process exits now
    b.engine.close()
    b.client.close()
    try:
        peers.send(lid_b, b"step-42")
        die("handover", "a dead replica acknowledged")
    except connex.Unavailable:
        pass
    # Without a peer-death event (a backend without them) the sender evicts it itself; either
    # way it is evicted for every sender.
    if peers.is_usable(lid_b, b.epoch):
        peers.mark_failed(lid_b)
    next_lid = peers.pick(current=lid_b)
    peers.send(next_lid, b"step-42")
    handed = receive(a.inbox)
    ms = int((time.monotonic() - start) * 1000)
    why = ""
    if wait_until(lambda: failure, 3):
        with lock:
            why = failure[0]
    print(f"handover:   {listing(peers.peer_lids())} {handed} ({lid_b} evicted by {why}, "
          f"resent to {next_lid} in {ms} ms)")

    # Replica 1 comes back (scale up): a new process, the same LID, a new epoch.
    old_epoch_b = b.epoch
    if not wait_until(lambda: peers.pending_reports == 0, 5):
        die("rejoin", "the eviction was not reported")
    b = Replica(directory, make_transport, lid_b)
    if not peers.wait_ready(2, timeout=5):
        die("rejoin", "replica 1 not seen")
    print(f"rejoin:     {listing(peers.peer_lids())} ({lid_b} epoch {old_epoch_b} -> {b.epoch})")

    # Replica 0 migrates its inbox to a new address under the same LID.
    moved = MessageInbox()
    new_epoch = a.client.join(lid_a, [moved.address] + a.engine.local_addresses)
    if not wait_until(lambda: peers.is_usable(lid_a, new_epoch), 5):
        die("migrate", "migration not seen")
    a.inbox.stop()  # the old address is gone
    peers.send(lid_a, b"after-migrate")
    print(f"migrate:    {receive(moved)} ({lid_a} epoch {a.epoch} -> {new_epoch}, "
          f"now at {moved.address})")

    # Replica 1 leaves gracefully (scale down): draining, never picked again.
    b.client.leave(lid_b)
    if not wait_until(lambda: len(peers.peer_lids()) == 1, 5):
        die("scale-down", "LEFT not seen")
    print(f"scale-down: {listing(peers.peer_lids())} ({lid_b} {peers.state_of(lid_b, b.epoch)})")
    a.client.leave_all()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except connex.Error as error:
        die(type(error).__name__, error)
