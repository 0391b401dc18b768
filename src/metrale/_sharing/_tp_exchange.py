"""What the ranks of a tensor-parallel arena send each other at construction.

The checks of the arena descriptions every rank all-gathers (step 2 of the
protocol in `metrale.tp`), and the exchange of the slabs' descriptors
between the ranks of one host (step 3): a header then the descriptors
(SCM_RIGHTS) over each peer's Unix socket, received as they come, with the
peer credentials telling ranks from strangers.  Nothing here raises for
what a peer or a stranger sends: the errors are returned, for the second
all-gather.
"""

import json
import os
import socket
import struct
import time

from .._base.errors import MetraleError

_HEADER_MAX = 1 << 20

def _ns(kind):
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return ""


_INFO_KEYS = ("version", "device_type", "device", "host", "pidns", "pid", "socket",
              "granularity", "signal", "slab", "max_batch_tokens", "buffers", "layout", "chunks")


def _malformed(info):
    """What is wrong with a gathered arena description (None: nothing), so
    that a rank sending garbage fails every rank with the same error."""
    if not isinstance(info, dict) or type(info.get("ok")) is not bool:
        return f"{type(info).__name__}, not a metrale arena description"
    if not info["ok"]:
        return None if isinstance(info.get("error"), str) else "a failure without its error"
    missing = [k for k in _INFO_KEYS if k not in info]
    if missing:
        return f"an arena description without {', '.join(missing)}"
    layout, chunks = info["layout"], info["chunks"]
    if not isinstance(info["buffers"], str):
        return "a buffer set without its fingerprint"
    if type(info["signal"]) is not int or info["signal"] <= 0:
        return "a signal area of no size"
    if (not isinstance(layout, (list, tuple)) or
            not all(isinstance(e, (list, tuple)) and len(e) == 3 and
                    all(type(x) is int for x in e) for e in layout)):
        return "a layout of the wrong shape"
    if not isinstance(chunks, list) or not all(
            isinstance(c, list) and len(c) == 2 and all(type(x) is int for x in c) for c in chunks):
        return "a malformed chunk list"
    return None


def _check_agreement(infos, names):
    """Raise MetraleError unless every rank's info agrees with rank 0's; the
    same message on every rank (computed from the same gathered list; the
    buffer `names` are compared, by fingerprint, before they are used)."""
    for r, info in enumerate(infos):
        why = _malformed(info)
        if why is not None:
            raise MetraleError(f"tensor-parallel arena: rank {r} sent {why}")
        if not info["ok"]:
            raise MetraleError(f"tensor-parallel arena: rank {r} failed to build its arena "
                               f"({info['error']}); nothing is shared")
    ref = infos[0]
    for r, info in enumerate(infos[1:], 1):
        for key, what in (("version", "the metrale version"),
                          ("device_type", "the backend's device type"),
                          ("granularity", "the allocation granularity"),
                          ("signal", "the signal area's size"),
                          ("buffers", "the buffer set (its fingerprint)")):
            if info[key] != ref[key]:
                raise MetraleError(f"tensor-parallel arena: rank {r} and rank 0 disagree on "
                                   f"{what}: {info[key]!r} vs {ref[key]!r}")
        if len(info["layout"]) != len(names) or len(ref["layout"]) != len(names):
            raise MetraleError(f"tensor-parallel arena: rank {r} sent a layout of "
                               f"{len(info['layout'])} buffers for a set of {len(names)}")
        if info["layout"] != ref["layout"]:
            order = sorted(range(len(names)), key=lambda i: (ref["layout"][i][0], i))
            for i in order:
                a, b = ref["layout"][i], info["layout"][i]
                if a != b:
                    raise MetraleError(
                        f"tensor-parallel arena: rank {r} and rank 0 disagree on buffer "
                        f"{names[i]!r}: rank 0 has {a[1]} bytes at offset {a[0]:#x} "
                        f"(room {a[2]}), rank {r} {b[1]} bytes at offset {b[0]:#x} (room {b[2]}); "
                        "build every rank's arena from the same config, limits and levers")
        for key, what in (("max_batch_tokens", "max_batch_tokens"), ("slab", "the slab size"),
                          ("chunks", "the physical chunks")):
            if info[key] != ref[key]:
                raise MetraleError(f"tensor-parallel arena: rank {r} and rank 0 disagree on "
                                   f"{what}: {info[key]!r} vs {ref[key]!r}")


def _header(me, to, chunks, error):
    """What rank `me` sends rank `to` before its descriptors (JSON): one per
    chunk, then one for its signal area."""
    return json.dumps({"rank": me, "to": to, "chunks": [[c[0], c[1]] for c in chunks],
                       "error": error}).encode()


def _exchange(gpu, slabs, me, infos, local, chunks, srv, timeout, bases, signals, base_align):
    """Make this rank's signal area, send its chunks and signal area to each
    local peer, receive and map theirs; returns the errors seen here (the
    caller all-gathers them).  Never raises for what a peer or a stranger
    sends: every rank must reach the second all-gather, or the others would
    wait out the group's timeout."""
    own = error = None
    try:
        n = infos[me]["signal"]
        signals[me], handle = slabs.map_signal(n)
        own = list(chunks) + [(0, n, handle)]
    except Exception as e:
        error = f"rank {me} could not export its slab: {type(e).__name__}: {e}"
    errors, gone = _send_all(gpu, me, infos, [q for q in local if q != me], own, error, timeout)
    pending = set(local) - {me} - gone
    try:
        _gather_slabs(slabs, me, infos, pending, srv, timeout, bases, signals, errors, base_align)
    except Exception as e:          # a bug here must not strand the other ranks
        errors.append(f"rank {me} failed while receiving its peers' slabs: "
                      f"{type(e).__name__}: {e}")
    return errors


def _send_all(gpu, me, infos, peers, own, error, timeout):
    """Export `own` (this rank's chunks, then its signal area: (offset,
    bytes, handle) each) and send them to each of `peers` over its socket,
    after a header; with `error` (or when the export fails) send that
    instead.  Returns the errors seen here and the peers known gone (their
    socket refused the connection: nobody listens there); never raises for
    a peer."""
    from ._peer_slabs import export_chunks
    errors = [error] if error else []
    gone = set()
    fds = []
    if error is None:
        try:
            fds = export_chunks(gpu, own)
        except Exception as e:
            error = f"rank {me} could not export its slab: {type(e).__name__}: {e}"
            errors.append(error)
    chunks = own[:-1] if own else []
    try:
        for q in peers:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as c:
                    c.settimeout(timeout)
                    c.connect(infos[q]["socket"])
                    c.send(_header(me, q, chunks, error))
                    if error is None:
                        for fd in fds:
                            socket.send_fds(c, [b"c"], [fd])
            except (ConnectionRefusedError, FileNotFoundError) as e:
                gone.add(q)
                errors.append(f"rank {me} could not send its slab to rank {q}, which is gone "
                              f"(its socket refused the connection: {e}); not waited for")
            except OSError as e:
                errors.append(f"rank {me} could not send its slab to rank {q}: {e}")
    finally:
        for fd in fds:
            os.close(fd)
    return errors, gone


def _gather_slabs(slabs, me, infos, pending, srv, timeout, bases, signals, errors, base_align,
                  attach=False):
    """Accept connections until every pending rank's slab is mapped (or has
    failed, or the deadline passes).  Connections are read when they have
    data, so a silent stranger holds up nobody; one whose peer credentials
    show it is no rank of the group is closed at once."""
    import selectors
    deadline = time.monotonic() + timeout
    pids = {infos[r]["pid"]: r for r in pending} if all(
        infos[r]["pidns"] == _ns("pid") for r in pending) else None
    sel = selectors.DefaultSelector()
    srv.setblocking(False)
    sel.register(srv, selectors.EVENT_READ)
    try:
        while pending:
            if pids is not None:        # a rank known dead is not waited for
                for r in sorted(pending):
                    if _gone(infos[r]["pid"]):
                        pending.discard(r)
                        errors.append(f"rank {me} got no slab from rank {r}: its process "
                                      f"{infos[r]['pid']} is gone; not waited for")
                if not pending:
                    return
            left = deadline - time.monotonic()
            if left <= 0:
                errors.append(f"rank {me} got no slab from rank(s) {sorted(pending)} within "
                              f"{timeout:g} s (did they die?)")
                return
            # in slices, so that a rank that dies meanwhile is seen
            for key, _ in sel.select(min(left, _POLL) if pids is not None else left):
                if key.fileobj is srv:
                    try:
                        conn, _ = srv.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as e:    # e.g. out of descriptors: retrying would spin
                        errors.append(f"rank {me} could not accept a peer's connection: {e}")
                        return
                    who = _peer_rank(conn, pids)
                    if who is False:        # provably no rank of the group: ignored
                        conn.close()
                        continue
                    sel.register(conn, selectors.EVENT_READ, who)
                    continue
                conn = key.fileobj
                sel.unregister(conn)
                with conn:
                    conn.settimeout(max(deadline - time.monotonic(), 0.001))
                    r, err = _receive(conn, key.data, slabs, me, infos, pending, bases,
                                      signals, base_align, attach)
                if r is None:
                    continue                # a stranger's message: ignored
                pending.discard(r)
                if err:
                    errors.append(err)
    finally:
        for key in list(sel.get_map().values()):
            if key.fileobj is not srv:
                key.fileobj.close()
        sel.close()


# How often a wait for the peers' slabs looks whether a pending rank died (s).
_POLL = 0.25


def _gone(pid):
    """Whether process `pid` (of this pid namespace) has exited: no such
    process, or a zombie its parent has not reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")


def _peer_rank(conn, pids):
    """The pending rank whose process is at the other end of `conn` (by its
    peer credentials), None when that cannot be told (another pid
    namespace), False when it is no pending rank."""
    if pids is None:
        return None
    try:
        pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  struct.calcsize("3i")))[0]
    except OSError:
        return None
    return pids.get(pid, False)


def _receive(conn, sender, slabs, me, infos, pending, bases, signals, base_align, attach=False):
    """One peer's header and descriptors: (rank, its error or None), or
    (None, None) for a message that is no pending rank's.  `sender` is the
    rank the peer credentials showed (None: unknown).  Whatever a rank sends
    that is malformed becomes an error naming it; nothing here raises."""
    try:
        raw = conn.recv(_HEADER_MAX)
    except OSError as e:
        if sender is None:
            return None, None
        return sender, f"rank {me} could not read rank {sender}'s header: {e}"
    try:
        header = json.loads(raw)
    except Exception:               # not JSON, or nested too deeply
        header = None
    claimed = header.get("rank") if isinstance(header, dict) else None
    r = sender if sender is not None else claimed
    if type(r) is not int or r not in pending:
        return None, None
    if sender is None and (not isinstance(header, dict) or header.get("to") != me):
        return None, None           # not provably from rank r, and not for this rank
    try:
        if not isinstance(header, dict) or header.get("rank") != r or header.get("to") != me:
            raise ValueError(f"not a header from rank {r} to rank {me}: {raw[:200]!r}")
        if header.get("error"):
            return r, str(header["error"])
        chunks = header.get("chunks")
        if (not isinstance(chunks, list) or
                not all(isinstance(c, list) and len(c) == 2 and all(type(x) is int for x in c)
                        for c in chunks)):
            raise ValueError(f"malformed chunk list {chunks!r}"[:300])
        if chunks != infos[r]["chunks"]:
            raise ValueError(f"sent chunks {chunks}, not the ones it announced")
        fds = []
        try:
            for _ in range(len(chunks) + 1):        # the chunks, then the signal area
                _msg, got, flags, _addr = socket.recv_fds(conn, 16, 1)
                fds.extend(got)
                if flags & socket.MSG_CTRUNC or len(got) != 1:
                    raise OSError(f"a descriptor did not arrive (flags {flags:#x}, "
                                  f"{len(got)} descriptors; out of descriptors?)")
            n = infos[r]["signal"]
            if attach:          # the same addresses as before detach_peers
                slabs.remap_peer(("signal", r), [(0, n)], fds[-1:])
                slabs.remap_peer(r, [tuple(c) for c in chunks], fds[:-1])
            else:
                signals[r] = slabs.map_peer(("signal", r), n, [(0, n)], fds[-1:])
                bases[r] = slabs.map_peer(r, infos[r]["slab"], [tuple(c) for c in chunks],
                                          fds[:-1], base_align)
        finally:
            for fd in fds:
                os.close(fd)
    except Exception as e:
        return r, f"rank {me} failed to map rank {r}'s slab: {type(e).__name__}: {e}"
    return r, None
