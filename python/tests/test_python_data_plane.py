"""connex.transport.from_python: a data plane written in Python (Mooncake's TransferEngine method
names) used as the C++ stack's TransferEngine — reads, managed buffers, copies, errors, and a
pipeline's steps over it (the multi-process case is in test_pp_failover.py)."""

import numpy as np
import pytest

import connex
import connex.pp
from connex import transport
from connex.directory import DirectoryClient

from py_data_plane import TcpDataPlane
from toy_engine import ToyEngine, reference_tokens


@pytest.fixture
def planes():
    made = []

    def make(lid):
        plane = TcpDataPlane()
        made.append(plane)
        return plane, transport.from_python(plane, lid, plane.address)

    yield make
    for p in made:
        p.close()


def test_a_read_through_python_lands_in_the_callers_array(planes):
    owner_plane, owner = planes(("d", 1, 0, 0))
    _, reader = planes(("d", 2, 0, 0))
    assert owner.local_addresses == ["py://" + owner_plane.address]
    caps = owner.capabilities
    assert caps.backend == "python" and not caps.peer_events and caps.cross_process
    src = np.arange(1 << 18, dtype=np.float32)
    addr = owner.register_memory(src)
    dst = np.zeros_like(src)
    reader.register_memory(dst)
    reader.transfer_sync_read((("d", 1, 0, 0), owner.local_addresses), dst, addr)
    assert np.array_equal(src, dst) and owner_plane.served == 1
    owner.unregister_memory(src)
    with pytest.raises(connex.Unavailable, match="returned -1"):  # no longer registered
        reader.transfer_sync_read((("d", 1, 0, 0), owner.local_addresses), dst, addr)


def test_the_seven_method_protocol_is_connex_pp_transports():
    # What the reference's README documents: the TransferEngine protocol in connex/pp/transports.py.
    from connex.pp.transports import TransferEngine

    plane = TcpDataPlane()
    try:
        assert isinstance(plane, TransferEngine)
        assert not isinstance(object(), TransferEngine)
        methods = [m for m in vars(TransferEngine) if not m.startswith("_")]
        assert sorted(methods) == sorted([
            "register_memory", "unregister_memory", "transfer_sync_read",
            "allocate_managed_buffer", "free_managed_buffer", "write_bytes_to_buffer",
            "read_bytes_from_buffer"])
    finally:
        plane.close()


def test_managed_buffers_and_copies_go_through_the_python_object(planes):
    plane, engine = planes(("d", 1, 0, 0))
    buf = engine.allocate_managed_buffer(64)
    assert buf.address in plane._managed
    engine.copy_to_managed_buffer(buf, b"x" * 16, offset=8)
    out = bytearray(16)
    engine.copy_from_managed_buffer(out, buf, offset=8)
    assert out == b"x" * 16
    with pytest.raises(connex.InvalidArgument, match="overrun"):
        engine.copy_to_managed_buffer(buf, b"x" * 64, offset=8)
    buf.free()
    assert buf.address not in plane._managed


def test_bad_data_planes():
    class NoRead:
        def register_memory(self, a, n):
            return 0

    with pytest.raises(TypeError, match="has no method unregister_memory"):
        transport.from_python(NoRead(), ("d", 1, 0, 0), "x:1")
    with pytest.raises(connex.InvalidArgument, match="address is empty"):
        transport.from_python(TcpDataPlane(), ("d", 1, 0, 0), "")

    class Raising(TcpDataPlane):
        def transfer_sync_read(self, *args):
            raise connex.Fenced("not that one")

        def register_memory(self, addr, length):
            return -3

    plane = Raising()
    engine = transport.from_python(plane, ("d", 1, 0, 0), plane.address)
    with pytest.raises(connex.InvalidArgument, match="register_memory returned -3"):
        engine.register_memory(bytearray(8))
    buf = engine.allocate_managed_buffer(8)
    with pytest.raises(connex.Fenced, match="Fenced: not that one"):
        engine.transfer_sync_read((("d", 2, 0, 0), ["py://127.0.0.1:1"]), buf.address, 0, 8)
    with pytest.raises(connex.Unavailable, match="publishes no py:// address"):
        engine.transfer_sync_read((("d", 2, 0, 0), ["tcp://127.0.0.1:1"]), buf.address, 0, 8)
    plane.close()


def test_a_pipeline_in_one_process_over_python_data_planes(server, planes):
    client = DirectoryClient(server.bind_addr)
    client.start()
    p1, t1 = planes(("q", 1, 0, 0))
    p0, t0 = planes(("q", 0, 0, 0))
    n1 = connex.pp.StageNode(client, ToyEngine(1, 2), model="q", stage=1, stages=2, transport=t1)
    n0 = connex.pp.StageNode(client, ToyEngine(0, 2), model="q", stage=0, stages=2, transport=t0)
    futures = [n0.submit(i, [1, 2, i], 12) for i in range(5)]
    for i, f in enumerate(futures):
        assert f.result(timeout=30) == reference_tokens([1, 2, i], 12, 2)
    assert p1.reads > 0 and p0.served > 0  # stage 1 pulled every step from the owner's ring
    n0.close()
    n1.close()
    client.close()
