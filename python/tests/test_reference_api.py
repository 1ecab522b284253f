"""The reference README's "Core abstractions" snippet, nearly verbatim (free ports, real inbox
addresses, and a transport for the sender): the names and call shapes users expect work."""

from connex.directory import DirectoryClient
from connex.directory_server import DirectoryServer
from connex.elastic import ElasticPeerSet, MessageInbox
from connex import transport as transports

from conftest import wait_until


def test_reference_core_abstractions_snippet():
    inbox_a, inbox_b, moved_a = MessageInbox(), MessageInbox(), MessageInbox()
    addr_a, addr_b, new_addr_a = inbox_a.address, inbox_b.address, moved_a.address
    transport = transports.tcp(("demo", 0, 0, 0))

    directory = DirectoryServer("127.0.0.1:0", "127.0.0.1:0")  # routes, leases, events
    directory.start()

    # each replica JOINs under LID ("demo", group=1, shard=0, replica=r)
    a = DirectoryClient(directory.bind_addr, "demo", stage_idx=1, replica_idx=0,
                        local_addresses=[addr_a]); a.start(); a.register()
    b = DirectoryClient(directory.bind_addr, "demo", stage_idx=1, replica_idx=1,
                        local_addresses=[addr_b]); b.start(); b.register()

    # the sender resolves the group through the directory, not fixed ranks
    owner = DirectoryClient(directory.bind_addr, "demo", stage_idx=0); owner.start()
    owner.register(addresses=transport.local_addresses)  # a member may report failures
    peers = ElasticPeerSet(owner, transport, stage_idx=1)
    peers.start(); peers.wait_ready(2)
    assert peers.peer_lids() == [("demo", 1, 0, 0), ("demo", 1, 0, 1)]
    peers.send(peers.pick(), b"step")
    assert inbox_a.receive(timeout=3) == b"step"  # the owner's own replica (0)

    peers.mark_failed(("demo", 1, 0, 1))    # replica 1 died: evicted for every sender
    peers.send(peers.pick(), b"step-42")    # in-flight step handed over to replica 0
    assert inbox_a.receive(timeout=3) == b"step-42"
    assert peers.peer_lids() == [("demo", 1, 0, 0)]
    assert wait_until(lambda: peers.pending_reports == 0)
    b.register()                            # replica 1 rejoins (scale up)
    assert peers.wait_ready(2)
    a.register(addresses=[new_addr_a])      # replica 0 migrates, same LID
    assert wait_until(lambda: peers.live(("demo", 1, 0, 0)).addresses == [new_addr_a])
    peers.send(("demo", 1, 0, 0), b"after-migrate")
    assert moved_a.receive(timeout=3) == b"after-migrate"
    b.deregister()                          # scale down
    assert wait_until(lambda: peers.peer_lids() == [("demo", 1, 0, 0)])

    peers.close()
    for c in (a, b, owner):
        c.close()
    transport.close()
    directory.stop()
