"""A sender's live view of one group of endpoints, and its message channels."""

from connex._connex import (  # noqa: F401
    ElasticPeerSet,
    MessageInbox,
    PeerChange,
    PeerChangeKind,
    PeerInfo,
    PeerState,
)

__all__ = [
    "ElasticPeerSet",
    "MessageInbox",
    "PeerChange",
    "PeerChangeKind",
    "PeerInfo",
    "PeerState",
]
