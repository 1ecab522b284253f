"""The API surface of the `connex` package: modules, names, LIDs, exceptions and bad input."""

import ast
import pathlib
import re

import pytest

import connex
import connex._connex as ext
from connex import Lid
from connex.directory import DirectoryClient
from connex.directory_server import DirectoryServer
from connex.elastic import ElasticPeerSet
from connex import transport


def test_version_and_submodules():
    assert re.fullmatch(r"\d+\.\d+\.\d+", connex.__version__)
    for name in ["DirectoryClient", "Event", "EventKind", "EventStream", "Record", "Snapshot"]:
        assert hasattr(connex.directory, name)
    assert DirectoryServer is ext.DirectoryServer
    assert ElasticPeerSet is ext.ElasticPeerSet
    for name in ["tcp", "shm", "ucx", "mem", "auto", "create_transfer_engine", "TransferEngine",
                 "ManagedBuffer", "Fabric", "PeerEvent"]:
        assert hasattr(transport, name), name
    for cls in [DirectoryClient, DirectoryServer, ElasticPeerSet, transport.TransferEngine]:
        assert cls.__doc__ and len(cls.__doc__) > 40


def test_every_extension_name_is_in_the_stub():
    stub = (pathlib.Path(connex.__file__).parent / "_connex.pyi").read_text()
    declared = set(re.findall(r"^(?:class|def) (\w+)", stub, re.M))
    declared |= set(re.findall(r"^(\w+)\s*:", stub, re.M))
    public = {n for n in dir(ext) if not n.startswith("_")}
    assert public - declared == set()


def test_the_stub_declares_every_member_of_every_class():
    tree = ast.parse((pathlib.Path(connex.__file__).parent / "_connex.pyi").read_text())
    checked = 0
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or not hasattr(ext, node.name):
            continue
        cls = getattr(ext, node.name)
        if issubclass(cls, BaseException):
            continue
        declared = set()
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                declared.add(item.name)
            elif isinstance(item, ast.AnnAssign):
                declared.add(item.target.id)
        enum_like = any(isinstance(b, ast.Attribute) and b.attr == "Enum" for b in node.bases)
        runtime = {n for n in vars(cls) if not n.startswith("_")}
        if enum_like:
            runtime = set(cls.__members__)
        assert runtime - declared == set(), node.name
        checked += 1
    assert checked >= 20


def test_exception_hierarchy_carries_code_and_message():
    expected = {
        14: (connex.Unavailable, ConnectionError),
        9: (connex.Fenced, connex.Error),
        5: (connex.NotFound, LookupError),
        3: (connex.InvalidArgument, ValueError),
        6: (connex.AlreadyExists, connex.Error),
        7: (connex.PermissionDenied, PermissionError),
        4: (connex.DeadlineExceeded, TimeoutError),
        10: (connex.Aborted, connex.Error),
        2: (connex.Error, Exception),  # UNKNOWN: the base class itself
    }
    for code, (cls, also) in expected.items():
        with pytest.raises(cls) as info:
            ext._raise_status(code, "directory: JOIN for demo/g1/s0/r1: epoch 7 is superseded")
        assert isinstance(info.value, connex.Error)
        assert isinstance(info.value, also)
        assert str(info.value) == "directory: JOIN for demo/g1/s0/r1: epoch 7 is superseded"
        assert info.value.code.isupper()
    with pytest.raises(connex.Fenced) as info:
        ext._raise_status(9, "fenced")
    assert info.value.code == "FAILED_PRECONDITION"


def test_set_log_level():
    connex.set_log_level("warn")
    with pytest.raises(connex.InvalidArgument, match="loud"):
        connex.set_log_level("loud")
    connex.set_log_level("info")


def test_lid_forms():
    lid = Lid("demo", 1, 0, 1)
    assert str(lid) == "demo/g1/s0/r1"
    assert repr(lid) == "Lid('demo', 1, 0, 1)"
    assert Lid(("demo", 1, 0, 1)) == lid
    assert Lid("demo/g1/s0/r1") == lid
    assert Lid.parse("demo/g1/s0/r1") == lid
    assert lid == ("demo", 1, 0, 1)
    assert lid == "demo/g1/s0/r1"
    assert lid != ("demo", 1, 0, 2)
    assert hash(lid) == hash(("demo", 1, 0, 1))
    assert {lid: 1}[Lid("demo/g1/s0/r1")] == 1
    model, group, shard, replica = lid
    assert (model, group, shard, replica) == ("demo", 1, 0, 1)
    assert lid.to_tuple() == ("demo", 1, 0, 1)
    assert (lid.model, lid.group, lid.shard, lid.replica) == ("demo", 1, 0, 1)
    assert sorted([Lid("demo", 1, 0, 2), lid]) == [lid, Lid("demo", 1, 0, 2)]


def test_bad_lids_raise_clear_errors():
    with pytest.raises(connex.InvalidArgument, match="demo/gX"):
        Lid.parse("demo/gX/s0/r1")
    with pytest.raises(connex.InvalidArgument, match="model"):
        Lid("bad name!", 1, 0, 0)
    with pytest.raises(connex.InvalidArgument, match="4 items|got 3"):
        Lid(("demo", 1, 0))
    with pytest.raises(TypeError, match="group must be an int"):
        Lid(("demo", "1", 0, 0))
    with pytest.raises(connex.InvalidArgument, match="replica"):
        Lid(("demo", 1, 0, -1))
    with pytest.raises(TypeError, match="expected a connex.Lid"):
        Lid(3.5)


def test_wrong_types_raise_type_error(server):
    with DirectoryClient(server.bind_addr) as client:
        with pytest.raises(TypeError):
            client.join(3.5, ["tcp://127.0.0.1:1"])
        with pytest.raises(TypeError):
            client.join(("demo", 1, 0, 0), 7)
        with pytest.raises(TypeError):
            client.join(("demo", 1, 0, 0), "tcp://127.0.0.1:1")  # a str is not a list
        with pytest.raises(TypeError):
            client.watch(42)
        with pytest.raises(connex.InvalidArgument, match="register"):
            client.register()  # no LID of its own
    with pytest.raises(TypeError):
        DirectoryClient(12)


def test_unknown_lid_raises_not_found(server):
    with DirectoryClient(server.bind_addr) as client:
        with pytest.raises(connex.NotFound, match="demo/g1/s0/r7"):
            client.resolve(("demo", 1, 0, 7))
        with pytest.raises(connex.NotFound):
            client.leave("demo/g1/s0/r7")
        with pytest.raises(connex.NotFound):
            client.renew(Lid("demo", 1, 0, 7))
        assert client.epoch_of(("demo", 1, 0, 7)) is None


def test_use_before_start_and_after_close(server):
    client = DirectoryClient(server.bind_addr)
    with pytest.raises(RuntimeError, match="not started"):
        client.view("demo")
    client.start()
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.view("demo")
    s = DirectoryServer()
    with pytest.raises(RuntimeError, match="not running"):
        s.bind_addr


def test_no_directory_is_unavailable():
    client = DirectoryClient("127.0.0.1:1", request_timeout_ms=300)
    with pytest.raises((connex.Unavailable, connex.DeadlineExceeded)) as info:
        client.start()
    assert isinstance(info.value, connex.Error)
    assert str(info.value)


def test_taken_address_is_reported(server):
    port = server.bind_addr.rsplit(":", 1)[1]
    other = DirectoryServer(f"127.0.0.1:{port}", "127.0.0.1:0")
    with pytest.raises(connex.Error, match=port):
        other.start()
