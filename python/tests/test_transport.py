"""Transfer engines over Python buffers: a numpy array read across the mem, tcp, shm and ucx
transports straight into the caller's array, read-only buffers, managed buffers, peer events."""

import numpy as np
import pytest

import connex
from connex import Lid, transport

from conftest import wait_until

A = Lid("demo", 1, 0, 0)
B = Lid("demo", 2, 0, 0)


def make_pair(backend):
    if backend == "mem":
        fabric = transport.Fabric()
        return transport.mem(A, fabric), transport.mem(B, fabric), fabric
    if backend == "tcp":
        return transport.tcp(A), transport.tcp(B), None
    if backend == "shm":
        return transport.shm(A), transport.shm(B), None
    if backend == "ucx":
        return transport.ucx(A), transport.ucx(B), None
    raise ValueError(backend)


@pytest.fixture(params=["mem", "tcp", "shm", "ucx"])
def pair(request):
    owner, reader, fabric = make_pair(request.param)
    yield owner, reader, fabric
    reader.close()
    owner.close()


def test_numpy_array_read_into_the_callers_array(pair):
    owner, reader, _ = pair
    src = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    src_addr = owner.register_memory(src)
    assert src_addr == src.ctypes.data  # the array's own memory, not a copy

    dst = np.zeros_like(src)
    dst_addr = reader.register_memory(dst)
    assert dst_addr == dst.ctypes.data
    peer = (A, owner.local_addresses)
    reader.transfer_sync_read(peer, dst, src_addr)
    assert np.array_equal(dst, src)
    assert dst.ctypes.data == dst_addr  # the bytes landed in the caller's array

    # A part of the array, through a memoryview slice of it (still no copy), from an offset.
    dst[:] = 0
    view = memoryview(dst)[1000:2000]
    reader.transfer_sync_read(connex.PeerRef(A, owner.local_addresses), view,
                              src_addr + 5000 * 4)
    assert np.array_equal(dst[1000:2000], src[5000:6000])
    assert not dst[:1000].any() and not dst[2000:].any()

    # The owner changes its array in place: a new read sees the change (same memory).
    src[:10] = -1
    reader.transfer_sync_read(peer, dst[:10], src_addr)
    assert (dst[:10] == -1).all()

    # By address and length.
    dst[:] = 0
    reader.transfer_sync_read(peer, dst_addr, src_addr, 64)
    assert np.array_equal(dst[:16], src[:16]) and not dst[16:].any()

    reader.unregister_memory(dst)
    owner.unregister_memory(src_addr)


def test_bytearray_and_memoryview(pair):
    owner, reader, _ = pair
    src = bytearray(b"connex-" * 1000)
    src_addr = owner.register_memory(memoryview(src))
    dst = bytearray(len(src))
    reader.register_memory(dst)
    reader.transfer_sync_read((A, owner.local_addresses), dst, src_addr)
    assert dst == src
    with pytest.raises(BufferError):
        src.append(0)  # held while registered: cannot be resized under the engine
    owner.unregister_memory(src)
    src.append(0)  # released


def test_read_only_buffer_where_writing_is_needed(pair):
    owner, reader, _ = pair
    data = b"read-only bytes" * 100
    with pytest.raises(connex.InvalidArgument, match="read-only") as info:
        reader.register_memory(data)
    assert "writable=False" in str(info.value)
    frozen = np.arange(100, dtype=np.int64)
    frozen.flags.writeable = False
    with pytest.raises(connex.InvalidArgument, match="read-only"):
        reader.register_memory(frozen)

    # Read-only memory may be registered for peers to read.
    src_addr = owner.register_memory(data, writable=False)
    dst = bytearray(len(data))
    reader.register_memory(dst)
    reader.transfer_sync_read((A, owner.local_addresses), dst, src_addr)
    assert bytes(dst) == data

    # ... but no read may land in it, by buffer or by address.
    with pytest.raises(connex.InvalidArgument, match="read-only"):
        owner.transfer_sync_read((B, reader.local_addresses), data, 0)
    with pytest.raises(connex.InvalidArgument, match="read-only"):
        owner.transfer_sync_read((B, reader.local_addresses), src_addr, 0, 10)


def test_bad_buffers_and_ranges(pair):
    owner, reader, _ = pair
    with pytest.raises(TypeError, match="buffer protocol"):
        reader.register_memory([1, 2, 3])
    with pytest.raises(ValueError, match="contiguous"):
        reader.register_memory(np.zeros((8, 8))[:, 1])
    src = np.ones(1024, dtype=np.uint8)
    src_addr = owner.register_memory(src)
    with pytest.raises(connex.InvalidArgument):
        owner.register_memory(src)  # overlaps
    unregistered = np.zeros(1024, dtype=np.uint8)
    with pytest.raises(connex.InvalidArgument):
        reader.transfer_sync_read((A, owner.local_addresses), unregistered, src_addr)
    dst = np.zeros(1024, dtype=np.uint8)
    reader.register_memory(dst)
    with pytest.raises(connex.InvalidArgument):
        reader.transfer_sync_read((A, owner.local_addresses), dst, src_addr + 4096)
    with pytest.raises(connex.InvalidArgument, match="exceeds"):
        reader.transfer_sync_read((A, owner.local_addresses), dst, src_addr, 4096)
    with pytest.raises(TypeError, match="peer"):
        reader.transfer_sync_read("not a peer", dst, src_addr)


def test_managed_buffers(pair):
    owner, reader, _ = pair
    buf = owner.allocate_managed_buffer(4096)
    assert len(buf) == 4096
    arr = np.frombuffer(buf, dtype=np.uint32)  # a view, no copy
    arr[:] = np.arange(1024, dtype=np.uint32)
    owner.copy_to_managed_buffer(buf, b"\xff\xff\xff\xff", offset=4)
    dst = np.zeros(1024, dtype=np.uint32)
    reader.register_memory(dst)
    reader.transfer_sync_read((A, owner.local_addresses), dst, buf.address)
    assert dst[0] == 0 and dst[1] == 0xFFFFFFFF and np.array_equal(dst[2:], arr[2:])
    out = bytearray(8)
    owner.copy_from_managed_buffer(out, buf, offset=8)
    assert bytes(out) == np.arange(2, 4, dtype=np.uint32).tobytes()
    with pytest.raises(connex.InvalidArgument, match="overrun"):
        owner.copy_from_managed_buffer(bytearray(16), buf, offset=4090)
    with pytest.raises(BufferError, match="views"):
        buf.free()  # `arr` still sees it
    del arr
    buf.free()
    assert buf.freed
    with pytest.raises(BufferError):
        memoryview(buf)


def test_mem_peer_death_is_an_event_and_reads_fail():
    fabric = transport.Fabric()
    owner = transport.mem(A, fabric)
    reader = transport.mem(B, fabric)
    events = []
    reader.subscribe_peer_events(events.append)
    src = np.ones(16)
    addr = owner.register_memory(src)
    dst = np.zeros(16)
    reader.register_memory(dst)
    reader.connect((A, owner.local_addresses))
    fabric.kill(A)
    assert wait_until(lambda: any(e.kind == transport.PeerEventKind.DEAD for e in events))
    dead = [e for e in events if e.kind == transport.PeerEventKind.DEAD][0]
    assert dead.lid == A
    with pytest.raises(connex.Unavailable):
        reader.transfer_sync_read((A, owner.local_addresses), dst, addr)
    reader.close()
    owner.close()


def test_capabilities_and_factory():
    engine = transport.create_transfer_engine("tcp", ("demo", 1, 0, 0))
    caps = engine.capabilities
    assert caps.backend == "tcp" and caps.cross_process and caps.peer_events
    assert engine.local_addresses[0].startswith("tcp://")
    assert engine.lid == ("demo", 1, 0, 0)
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.local_addresses
    with pytest.raises(connex.InvalidArgument, match="backend"):
        transport.create_transfer_engine("carrier-pigeon", ("demo", 1, 0, 0))
    with pytest.raises(connex.InvalidArgument):
        transport.create_transfer_engine("mem", ("demo", 1, 0, 0))  # no fabric


@pytest.mark.parametrize("backend", ["mem", "tcp"])
def test_close_while_other_threads_read(backend):
    """Threads reading (with the GIL released) while another closes both engines: each read
    completes, fails with connex.Error or sees the engine closed (RuntimeError); nothing crashes,
    and the destination arrays stay valid (the engine outlives the reads that use it)."""
    import threading

    owner, reader, _ = make_pair(backend)
    src = np.arange(1 << 16, dtype=np.float64)
    addr = owner.register_memory(src)
    peer = (A, owner.local_addresses)
    outcomes = []
    reads = [0]

    def read_loop():
        dst = np.zeros_like(src)
        try:
            reader.register_memory(dst)
            while True:
                reader.transfer_sync_read(peer, dst, addr)
                assert np.array_equal(dst, src)
                reads[0] += 1
        except connex.Error as e:
            outcomes.append(type(e).__name__)
        except RuntimeError as e:
            outcomes.append(str(e))

    threads = [threading.Thread(target=read_loop) for _ in range(4)]
    for t in threads:
        t.start()
    assert wait_until(lambda: reads[0] >= 40)  # the threads are reading
    reader.close()
    owner.close()
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive()
    assert len(outcomes) == 4, outcomes
