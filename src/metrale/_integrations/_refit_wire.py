"""The refit's wire (metrale.refit): length-prefixed JSON frames over a Unix
stream socket, file descriptors in batches within the kernel's limit, and the
peer's credentials."""

import json
import os
import socket
import struct
import time

__all__ = ["left", "send", "recv_exact", "recv", "send_fds", "recv_fds", "close_all",
           "peer_uid"]

_MAX_FRAME = 1 << 30
_FDS_PER_MESSAGE = 250      # below the kernel's SCM_MAX_FD (253)
_LEN = struct.Struct("<Q")


def left(deadline):
    """Seconds left to `deadline`.

    Parameters
    ----------
    deadline : float
        A `time.monotonic` time.

    Returns
    -------
    float

    Raises
    ------
    TimeoutError
        `deadline` has passed.
    """
    s = deadline - time.monotonic()
    if s <= 0:
        raise TimeoutError("timed out")
    return s


def send(sock, obj):
    """Send one frame: `obj` as JSON after its length.

    Parameters
    ----------
    sock : socket.socket
    obj : dict
        JSON-serialisable, with a str "kind".
    """
    raw = json.dumps(obj).encode()
    sock.sendall(_LEN.pack(len(raw)) + raw)


def recv_exact(sock, n, deadline):
    """Receive exactly `n` bytes.

    Parameters
    ----------
    sock : socket.socket
    n : int
    deadline : float
        A `time.monotonic` time (TimeoutError after it).

    Returns
    -------
    bytes

    Raises
    ------
    ConnectionError
        The other side closed the connection first.
    """
    buf = bytearray()
    while len(buf) < n:
        sock.settimeout(left(deadline))
        got = sock.recv(min(n - len(buf), 1 << 20))
        if not got:
            raise ConnectionError("the other side closed the connection")
        buf += got
    return bytes(buf)


def recv(sock, deadline):
    """Receive one frame.

    Parameters
    ----------
    sock : socket.socket
    deadline : float
        A `time.monotonic` time (TimeoutError after it).

    Returns
    -------
    dict
        With a str "kind".

    Raises
    ------
    ConnectionError
        The connection closed, or what came is not this protocol's frame.
    """
    (n,) = _LEN.unpack(recv_exact(sock, _LEN.size, deadline))
    if n > _MAX_FRAME:
        raise ConnectionError(f"a frame of {n:,} bytes: not this protocol")
    try:
        obj = json.loads(recv_exact(sock, n, deadline))
    except ValueError as e:
        raise ConnectionError(f"a frame that is not JSON: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
        raise ConnectionError("a frame with no kind: not this protocol")
    return obj


def send_fds(sock, fds):
    """Send descriptors (not closed here), in messages within the kernel's limit.

    Parameters
    ----------
    sock : socket.socket
    fds : list of int
    """
    for i in range(0, len(fds), _FDS_PER_MESSAGE):
        socket.send_fds(sock, [b"F"], fds[i:i + _FDS_PER_MESSAGE])


def recv_fds(sock, n, deadline):
    """Receive `n` descriptors; those received are closed if any step fails.

    Parameters
    ----------
    sock : socket.socket
    n : int
    deadline : float
        A `time.monotonic` time (TimeoutError after it).

    Returns
    -------
    list of int

    Raises
    ------
    ConnectionError
        Another number of descriptors came, or a message not this protocol's.
    """
    fds = []
    try:
        while len(fds) < n:
            sock.settimeout(left(deadline))
            want = min(n - len(fds), _FDS_PER_MESSAGE)
            msg, got, flags, _addr = socket.recv_fds(sock, 1, want)
            fds += got
            if msg != b"F" or len(got) != want or flags & socket.MSG_CTRUNC:
                raise ConnectionError(f"expected {want} descriptors, got {len(got)}")
    except BaseException:
        close_all(fds)
        raise
    return fds


def close_all(fds):
    """Close each descriptor, whatever closing another raised.

    Parameters
    ----------
    fds : list of int
    """
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def peer_uid(sock):
    """The user id of the process at the other end (SO_PEERCRED).

    Parameters
    ----------
    sock : socket.socket
        A connected Unix socket.

    Returns
    -------
    int
    """
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]
