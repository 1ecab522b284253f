"""The data plane: transfer engines (mem, tcp, shm, ucx, auto) over Python buffers.

``register_memory`` takes anything with the buffer protocol (numpy arrays, bytearray,
memoryview) and registers its memory without a copy; ``transfer_sync_read`` lands the bytes
directly in the caller's buffer.
"""

from connex._connex import (  # noqa: F401
    Capabilities,
    Fabric,
    ManagedBuffer,
    PeerEvent,
    PeerEventKind,
    PeerRef,
    TransferEngine,
    auto,
    create_transfer_engine,
    from_env,
    from_python,
    mem,
    shm,
    tcp,
    ucx,
)

__all__ = [
    "Capabilities",
    "Fabric",
    "ManagedBuffer",
    "PeerEvent",
    "PeerEventKind",
    "PeerRef",
    "TransferEngine",
    "auto",
    "create_transfer_engine",
    "from_env",
    "from_python",
    "mem",
    "shm",
    "tcp",
    "ucx",
]
