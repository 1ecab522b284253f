"""The data plane the step protocol needs: seven methods of a transfer engine.

``connex.pp`` moves a step's tensors with one-sided reads and nothing else of a data plane, so any
library that offers these seven methods (Mooncake's Python ``TransferEngine`` does, with these
names and arguments) can carry it: wrap an object that satisfies :class:`TransferEngine` with
``connex.transport.from_python(obj, lid, address)`` and give the result to a ``StageNode``. None
of the mobility logic (identities, epochs, failover) lives here.

Addresses are integers (virtual addresses in the engine's process); ``target_hostname`` is the
peer's address as the engine publishes it.
"""

from typing import Protocol, runtime_checkable


@runtime_checkable
class TransferEngine(Protocol):
    """The seven methods ``connex.transport.from_python`` calls (the last two are optional there:
    without them, copies into and out of managed buffers go through ``ctypes.memmove``)."""

    def register_memory(self, buffer_addr: int, capacity: int) -> int:
        """Makes ``[buffer_addr, buffer_addr + capacity)`` readable by peers; 0 on success."""

    def unregister_memory(self, buffer_addr: int) -> int:
        """Ends a registration made by :meth:`register_memory`; 0 on success."""

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                           length: int) -> int:
        """Reads ``length`` bytes at ``peer_buffer_address`` of the peer ``target_hostname`` into
        local registered memory at ``buffer``; returns 0 on success, negative when the peer is
        unreachable (the step protocol then fails the step over)."""

    def allocate_managed_buffer(self, length: int) -> int:
        """A registered buffer of ``length`` bytes owned by the engine; its address (0: none)."""

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        """Frees a buffer of :meth:`allocate_managed_buffer`; 0 on success."""

    def write_bytes_to_buffer(self, dest_address: int, src: bytes, length: int) -> int:
        """Copies ``length`` bytes of ``src`` into a managed buffer; 0 on success."""

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        """The ``length`` bytes at ``source_address`` of a managed buffer."""


__all__ = ["TransferEngine"]
