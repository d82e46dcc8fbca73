"""ZooKeeper's wire format (jute): the few records this store sends and reads.

Every packet is a big-endian 4-byte length and a body. A request body is ``(xid, opcode)``
and the request's fields; an answer is ``(xid, zxid, err)`` and, when ``err`` is 0, the
answer's fields. Integers are big-endian, a string or a buffer is a 4-byte length (-1: null)
and its bytes, a vector a 4-byte count and its items, a boolean one byte.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence

# Opcodes (org.apache.zookeeper.ZooDefs.OpCode)
CREATE = 1
CREATE2 = 15  # create, answering the new znode's stat
DELETE = 2
EXISTS = 3
GET_DATA = 4
SET_DATA = 5
GET_CHILDREN = 8
CHECK = 13
MULTI = 14
PING = 11
CLOSE = -11
AUTH = 100
MULTI_READ = 22  # 3.6+: getData and getChildren, each answered on its own
ADD_WATCH = 106
MULTI_END = -1

# Special xids
WATCH_XID = -1
PING_XID = -2
AUTH_XID = -4

# Error codes (KeeperException.Code)
OK = 0
NO_NODE = -101
NO_AUTH = -102
BAD_VERSION = -103
NODE_EXISTS = -110
NOT_EMPTY = -111
SESSION_EXPIRED = -112
AUTH_FAILED = -115
UNIMPLEMENTED = -6
RUNTIME_INCONSISTENCY = -2

ERROR_NAMES = {
    -1: "system error",
    -2: "runtime inconsistency",
    -4: "connection loss",
    -6: "unimplemented",
    -7: "operation timeout",
    -8: "bad arguments",
    -101: "no node",
    -102: "not authorised",
    -103: "bad version",
    -110: "node exists",
    -111: "not empty",
    -112: "session expired",
    -114: "invalid ACL",
    -115: "authentication failed",
    -118: "session moved",
    -119: "not read-only",
    -127: "throttled",
}

# Watch events (Watcher.Event.EventType, KeeperState)
NODE_CREATED = 1
NODE_DELETED = 2
NODE_DATA_CHANGED = 3
NODE_CHILDREN_CHANGED = 4
STATE_EXPIRED = -112

# addWatch modes
PERSISTENT_RECURSIVE = 1

# Create flags
PERSISTENT = 0

OPEN_ACL_UNSAFE = ((0x1F, "world", "anyone"),)


def error_name(code: int) -> str:
    return f"{ERROR_NAMES.get(code, 'error')} ({code})"


class Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def int32(self, value: int) -> Writer:
        self.parts.append(struct.pack(">i", value))
        return self

    def int64(self, value: int) -> Writer:
        self.parts.append(struct.pack(">q", value))
        return self

    def boolean(self, value: bool) -> Writer:
        self.parts.append(b"\1" if value else b"\0")
        return self

    def buffer(self, value: bytes | None) -> Writer:
        if value is None:
            return self.int32(-1)
        self.int32(len(value))
        self.parts.append(value)
        return self

    def string(self, value: str) -> Writer:
        return self.buffer(value.encode())

    def acl(self, acl: Sequence[tuple[int, str, str]]) -> Writer:
        self.int32(len(acl))
        for perms, scheme, identity in acl:
            self.int32(perms).string(scheme).string(identity)
        return self

    def packet(self) -> bytes:
        body = b"".join(self.parts)
        return struct.pack(">i", len(body)) + body


class Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def _take(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise ValueError("a ZooKeeper answer ended early")
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk

    def int32(self) -> int:
        value: int = struct.unpack(">i", self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = struct.unpack(">q", self._take(8))[0]
        return value

    def boolean(self) -> bool:
        return self._take(1) != b"\0"

    def buffer(self) -> bytes | None:
        size = self.int32()
        return None if size < 0 else self._take(size)

    def string(self) -> str:
        return (self.buffer() or b"").decode(errors="surrogateescape")

    def stat(self) -> Stat:
        czxid, mzxid, _ctime, _mtime = self.int64(), self.int64(), self.int64(), self.int64()
        version, cversion, _aversion = self.int32(), self.int32(), self.int32()
        owner = self.int64()
        _length, children = self.int32(), self.int32()
        _pzxid = self.int64()
        return Stat(czxid, mzxid, version, cversion, owner, children)

    @property
    def left(self) -> int:
        return len(self.data) - self.at


@dataclasses.dataclass(frozen=True, slots=True)
class Stat:
    """What this store reads of a znode's stat: its creation and last change (zxids), its data
    version (reset to 0 when the znode is created again) and children."""

    czxid: int
    mzxid: int
    version: int
    cversion: int
    ephemeral_owner: int
    children: int


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    """One znode as read: its data and stat."""

    data: bytes
    stat: Stat


# -- request bodies -------------------------------------------------------------------------


def path_watch(path: str, watch: bool = False) -> Writer:
    """exists, getData, getChildren."""
    return Writer().string(path).boolean(watch)


def create(path: str, data: bytes, acl: Sequence[tuple[int, str, str]]) -> Writer:
    return Writer().string(path).buffer(data).acl(acl).int32(PERSISTENT)


def set_data(path: str, data: bytes, version: int) -> Writer:
    return Writer().string(path).buffer(data).int32(version)


def delete(path: str, version: int) -> Writer:
    return Writer().string(path).int32(version)


def check(path: str, version: int) -> Writer:
    return Writer().string(path).int32(version)


def add_watch(path: str, mode: int) -> Writer:
    return Writer().string(path).int32(mode)


def auth(scheme: str, credential: bytes) -> Writer:
    return Writer().int32(0).string(scheme).buffer(credential)


def multi(ops: Sequence[tuple[int, Writer]]) -> Writer:
    """Several operations (``ops``: opcode and body): writes all or nothing (`MULTI`), or
    reads each answered on its own (`MULTI_READ`: `GET_DATA`, `GET_CHILDREN`)."""
    out = Writer()
    for opcode, body in ops:
        out.int32(opcode).boolean(False).int32(-1)
        out.parts.extend(body.parts)
    return out.int32(MULTI_END).boolean(True).int32(-1)


@dataclasses.dataclass(frozen=True, slots=True)
class MultiResult:
    """One operation's outcome in a multi: its error (0: done), the stat of a setData or a
    getData, the data of a getData, the children of a getChildren."""

    err: int
    stat: Stat | None = None
    data: bytes | None = None
    children: tuple[str, ...] = ()


def read_multi(reader: Reader) -> list[MultiResult]:
    results: list[MultiResult] = []
    while True:
        opcode, done, _err = reader.int32(), reader.boolean(), reader.int32()
        if done:
            return results
        if opcode == -1:  # an error result: its code
            results.append(MultiResult(reader.int32()))
        elif opcode == SET_DATA:
            results.append(MultiResult(OK, reader.stat()))
        elif opcode == CREATE:
            reader.string()
            results.append(MultiResult(OK))
        elif opcode == GET_DATA:
            data = reader.buffer() or b""
            results.append(MultiResult(OK, reader.stat(), data))
        elif opcode == GET_CHILDREN:
            names = tuple(reader.string() for _ in range(reader.int32()))
            results.append(MultiResult(OK, children=names))
        else:  # check, delete: nothing more
            results.append(MultiResult(OK))
