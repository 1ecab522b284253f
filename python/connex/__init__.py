"""Connex: endpoint mobility primitives for dynamic LLM serving.

Python bindings over the C++ core (the extension module ``connex._connex``), with the reference
system's API names::

    from connex.directory import DirectoryClient
    from connex.directory_server import DirectoryServer
    from connex.elastic import ElasticPeerSet
    from connex import transport
    engine = connex.StageEngine.load("/models/Llama-3.2-1B", stage=0, stages=2)  # a StageNode's

Errors of the core are raised as :class:`connex.Error` subclasses, one per status code, carrying
the C++ message (``str(e)``) and the code's name (``e.code``).
"""

from connex._connex import (  # noqa: F401
    Aborted,
    AlreadyExists,
    Cancelled,
    DataLoss,
    DeadlineExceeded,
    Error,
    Fenced,
    Internal,
    InvalidArgument,
    Lid,
    NotFound,
    PeerRef,
    PermissionDenied,
    ResourceExhausted,
    StageEngine,
    Unavailable,
    __version__,
    set_log_level,
)

__all__ = [
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "DataLoss",
    "DeadlineExceeded",
    "Error",
    "Fenced",
    "Internal",
    "InvalidArgument",
    "Lid",
    "NotFound",
    "PeerRef",
    "PermissionDenied",
    "ResourceExhausted",
    "StageEngine",
    "Unavailable",
    "__version__",
    "set_log_level",
]
