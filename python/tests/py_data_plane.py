"""A data plane written in Python, with the method names of Mooncake's Python TransferEngine
(the reference's transfer-engine protocol): registered memory is read one-sidedly by peers over
TCP, served by a thread of the owner. For the tests that run the step protocol over
connex.transport.from_python; not fast, but real (separate processes, sockets, raw addresses).
"""

import ctypes
import socket
import struct
import threading

_REQUEST = struct.Struct("<QQ")  # remote address, length


def _view(addr, length):
    return memoryview((ctypes.c_char * length).from_address(addr)).cast("B")


class TcpDataPlane:
    def __init__(self, host="127.0.0.1"):
        self._lock = threading.Lock()
        self._regions = {}  # address -> length
        self._managed = {}  # address -> the ctypes buffer keeping it alive
        self._connections = {}  # target -> (socket, lock)
        self._server = socket.create_server((host, 0))
        self.address = f"{host}:{self._server.getsockname()[1]}"
        self.reads = 0  # transfer_sync_read calls that succeeded
        self.served = 0  # reads this process answered
        threading.Thread(target=self._accept, daemon=True).start()

    # ---- the protocol ----
    def register_memory(self, buffer_addr, capacity):
        with self._lock:
            self._regions[buffer_addr] = capacity
        return 0

    def unregister_memory(self, buffer_addr):
        with self._lock:
            return 0 if self._regions.pop(buffer_addr, None) is not None else -1

    def allocate_managed_buffer(self, length):
        buf = ctypes.create_string_buffer(length)
        addr = ctypes.addressof(buf)
        with self._lock:
            self._managed[addr] = buf
            self._regions[addr] = length
        return addr

    def free_managed_buffer(self, buffer_addr, length):
        with self._lock:
            self._regions.pop(buffer_addr, None)
            return 0 if self._managed.pop(buffer_addr, None) is not None else -1

    def write_bytes_to_buffer(self, dest_address, src, length):
        ctypes.memmove(dest_address, src, length)
        return 0

    def read_bytes_from_buffer(self, source_address, length):
        return ctypes.string_at(source_address, length)

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length):
        try:
            sock, lock = self._connection(target_hostname)
            with lock:
                sock.sendall(_REQUEST.pack(peer_buffer_address, length))
                status = sock.recv(1)
                if status != b"\0":
                    return -1
                view, got = _view(buffer, length), 0
                while got < length:
                    n = sock.recv_into(view[got:])
                    if n == 0:
                        raise ConnectionError("closed")
                    got += n
            self.reads += 1
            return 0
        except OSError:
            with self._lock:
                self._connections.pop(target_hostname, None)
            return -1

    def close(self):
        self._server.close()

    # ---- internals ----
    def _connection(self, target):
        with self._lock:
            c = self._connections.get(target)
        if c is None:
            host, port = target.rsplit(":", 1)
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = (sock, threading.Lock())
            with self._lock:
                self._connections[target] = c
        return c

    def _registered(self, addr, length):
        with self._lock:
            return any(a <= addr and addr + length <= a + n for a, n in self._regions.items())

    def _accept(self):
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            self._serve_reads(conn)
        except OSError:
            pass  # the reader went away (killed, or closed its plane)
        finally:
            conn.close()

    def _serve_reads(self, conn):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            head = b""
            while len(head) < _REQUEST.size:
                more = conn.recv(_REQUEST.size - len(head))
                if not more:
                    return
                head += more
            addr, length = _REQUEST.unpack(head)
            if not self._registered(addr, length):
                conn.sendall(b"\1")
                continue
            self.served += 1  # before the reply: the reader may look at once
            conn.sendall(b"\0" + _view(addr, length).tobytes())
