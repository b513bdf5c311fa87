"""Exceptions of the kvshare binding.

Every failing call raises a KvsError carrying the C status (a negative
kvshare code from kvs_status.h, or -errno), its name ("ENOSPC", or the
errno's name such as "ECONNREFUSED"), its static text (kvs_strerror) and the
daemon's message for it (kvs_last_message; "" when the daemon sent none, or
the library refused before sending).  The common statuses have subclasses
so that an engine can catch, say, NoSpaceError alone.
"""
import errno as _errno

from . import _lib


class KvsError(Exception):
    """A libkvshare call failed.

    status   the negative status code (int)
    name     its name: "ENOSPC", "ENOENT", ... or an errno name
    strerror kvs_strerror(status)
    message  the daemon's message for it ("" when none)
    """

    def __init__(self, status, message="", op=None):
        self.status = int(status)
        self.name = status_name(self.status)
        self.strerror = strerror(self.status)
        self.message = message or ""
        self.op = op
        super().__init__(self.status, self.message)

    def __str__(self):
        where = f"{self.op}: " if self.op else ""
        s = f"{where}{self.name} ({self.status}): {self.strerror}"
        if self.message and self.message != self.strerror:
            s += f": {self.message}"
        return s


class ConnectError(KvsError):
    """kvs_connect failed: no daemon, a refusal, a pool this process cannot
    map.  message is kvs_last_message(NULL): why."""


class NoSpaceError(KvsError):
    """KVS_ENOSPC: not enough free blocks (preempt or swap something)."""


class UnknownRequestError(KvsError):
    """KVS_ENOENT: no such request in this session."""


class RequestExistsError(KvsError):
    """KVS_EEXIST: the request id is already in use."""


class MismatchError(KvsError):
    """KVS_EMISMATCH: tokens differ from what the request holds."""


class StateError(KvsError):
    """KVS_ESTATE: not allowed in the request's (or client's) state."""


class LimitError(KvsError):
    """KVS_ELIMIT: a daemon limit was reached."""


class NotSupportedError(KvsError):
    """KVS_ENOTSUP: not supported here (no tier, an older library, the
    wrong kind of pool for the view asked for)."""


class ConnectionClosedError(KvsError):
    """KVS_ECLOSED: the connection is broken or the client closed."""


_BY_STATUS = {
    _lib.ENOSPC: NoSpaceError,
    _lib.ENOENT: UnknownRequestError,
    _lib.EEXIST: RequestExistsError,
    _lib.EMISMATCH: MismatchError,
    _lib.ESTATE: StateError,
    _lib.ELIMIT: LimitError,
    _lib.ENOTSUP: NotSupportedError,
    _lib.ECLOSED: ConnectionClosedError,
}


def error_for(status, message="", op=None):
    """The KvsError (subclass) for a status."""
    return _BY_STATUS.get(int(status), KvsError)(status, message, op)


def status_name(status):
    """"ENOSPC" for KVS_ENOSPC, "ECONNREFUSED" for -ECONNREFUSED, ..."""
    name = _lib.text(_lib.lib().kvs_status_name(int(status)))
    if name == "E?" and -4096 < status < 0:
        name = _errno.errorcode.get(-status, name)
    return name


def strerror(status):
    """kvs_strerror(status): the static text for any status."""
    return _lib.text(_lib.lib().kvs_strerror(int(status)))
