"""The embedded in-memory directory server (routes, leases, events)."""

from connex._connex import DirectoryServer  # noqa: F401

__all__ = ["DirectoryServer"]
