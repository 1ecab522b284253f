"""The control plane's client: registration, leases, snapshots and membership events."""

from connex._connex import (  # noqa: F401
    DirectoryClient,
    Event,
    EventKind,
    EventStream,
    Record,
    RegistrationChange,
    Snapshot,
)

__all__ = [
    "DirectoryClient",
    "Event",
    "EventKind",
    "EventStream",
    "Record",
    "RegistrationChange",
    "Snapshot",
]
