"""A trainer writes an engine's weights in place, through one export (docs/rl.md).

The engine's side, `WeightExport`, listens on a Unix socket beside its weight
arena; each `sync` lends the weights' memory to the trainer for one refit: the
arena held (``BufferArena.export_memory``), its physical chunks sent as file
descriptors, then the trainer's commit awaited, which ends the hold and counts
one more in the weights' epoch.  The trainer's side, `WeightImport`, needs no
arena: it checks its tensors against the weight set (every name, element
type and shape, before a byte moves), maps the descriptors in a reservation of
its own (the same addresses at every sync) by offset, copying each run of
tensors that lies back to back in one source and in the arena as soon as the
chunks under it are mapped (`PeerSlabs.remap_peer`; on CUDA many runs a
kernel launch, kernels/copy_runs.cu), waits for the device, unmaps, and
commits.  No IPC handle per tensor, one descriptor per physical chunk.

A stream socket carries length-prefixed JSON frames, the descriptors after
the offer that names them (in batches within the kernel's limit); a peer of
another user is refused.  The trainer unmaps before it commits: once
`WeightExport.sync` returns, nothing outside the engine holds the weights'
memory, so a sleep gives it back.
"""

import contextlib
import os
import socket
import time

from . import _refit_wire as wire
from ._safetensors import _path_arg as _fspath_arg
from ._weight_copies import runs_of
from ._refit_check import check_state
from .weights import LoadStats, WeightSet, _check_arena
from .._backends._backend import Backend
from .._base._common import seconds_arg, stream_handle
from .._base.errors import MetraleError
from .._sharing._peer_slabs import PeerSlabs

__all__ = ["WeightExport", "WeightImport", "MappedWeights", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 60.0
_KEY = "weights"            # the trainer's PeerSlabs entry


def _path_arg(path, where):
    path = _fspath_arg(path, where)
    if not isinstance(path, str):
        raise TypeError(f"{where}: a socket's path must be a str, got {type(path).__name__}")
    if not path:
        raise ValueError(f"{where}: the socket's path is empty")
    return path


class WeightExport:
    """The engine's side: its weight arena lent to a trainer, one refit at a time.

    Parameters
    ----------
    arena : BufferArena
        The weight arena (`weight_arena`, exportable).
    ws : WeightSet
        Its weight set.
    path : str or os.PathLike
        Where the Unix socket is made (it must not exist; it is removed by
        `close`), readable by this user only.

    Raises
    ------
    TypeError
        A bad argument (named).
    MetraleError
        The arena does not hold `ws`.
    OSError
        The socket cannot be made at `path`.
    """

    def __init__(self, arena, ws, path):
        _check_arena(arena, ws, "WeightExport")
        path = _path_arg(path, "WeightExport")
        self.arena, self.ws, self.path = arena, ws, path
        self._conn = None
        self._table_sent = False    # the weight set's table goes in a connection's first offer
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            old = os.umask(0o177)
            try:
                srv.bind(path)
            finally:
                os.umask(old)
            srv.listen(1)
        except BaseException:
            srv.close()
            raise
        self._srv = srv

    def sync(self, *, timeout=DEFAULT_TIMEOUT):
        """Lend the weights to the trainer for one refit and wait for its commit.

        The first call waits for the trainer to connect.  While it runs the
        weight arena is held (`BufferArena.export_memory`): a sleep, a wake or
        a release from another thread is refused.  The engine's graphs keep
        their pointers: they read the new weights at their next replay.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait for the trainer (to connect, and to commit).

        Returns
        -------
        int
            The weights' epoch after the refit (``Guard.epochs``).

        Raises
        ------
        MetraleError
            No trainer connected in time, the connection failed, or the trainer
            aborted the refit or did not commit in time: unless the trainer
            aborted before its first copy, the weights may be partly written
            (their epoch counts one more all the same); the message says
            which.  The connection is dropped, and the next `sync` waits for a
            trainer again.  A trainer that is late, not dead, may still be
            writing until it sees the connection gone: refit again before
            trusting the weights.
        """
        where = "WeightExport.sync"
        deadline = time.monotonic() + seconds_arg(timeout, f"{where}: timeout")
        if self._srv is None:
            raise MetraleError(f"{where}: the export is closed")
        if self._conn is None:
            self._accept(deadline, where)
        ex = self.arena.export_memory(self.ws.tag)
        sent = False
        try:
            ws = self.ws
            offer = {"kind": "offer", "epoch": ex.epoch, "chunks": [list(c) for c in ex.chunks],
                     "span": max(o + n for o, n in ex.chunks),
                     "offset": ex.offsets[ws.buffer], "nbytes": ws.nbytes,
                     "params": None if self._table_sent else
                     [[p.name, p.dtype, list(p.shape)] for p in ws],
                     "align": ws.align, "buffer": ws.buffer, "tag": ws.tag, "wake": ws.wake}
            self._conn.settimeout(wire.left(deadline))
            wire.send(self._conn, offer)
            sent = self._table_sent = True
            wire.send_fds(self._conn, ex.fds())
            ex.close_fds()
            reply = wire.recv(self._conn, deadline)
        except (OSError, ConnectionError) as e:
            self._drop()
            epoch = ex.end(sent)
            what = "did not commit in time" if isinstance(e, TimeoutError) else \
                f"connection failed ({type(e).__name__}: {e})"
            raise MetraleError(f"{where}: the trainer {what}" +
                               (f"; the weights may be partly written (epoch {epoch})"
                                if sent else "; nothing was sent")) from e
        except BaseException:
            ex.end(sent)
            raise
        # an abort before the first copy wrote nothing: the epoch stays
        written = reply["kind"] == "commit" or reply.get("written") is not False
        epoch = ex.end(written)
        if reply["kind"] != "commit":
            self._drop()
            raise MetraleError(f"{where}: the trainer aborted the refit "
                               f"({reply.get('error', reply['kind'])}); " +
                               (f"the weights may be partly written (epoch {epoch})" if written
                                else "nothing was written"))
        return epoch

    def _accept(self, deadline, where):
        while True:
            try:
                self._srv.settimeout(wire.left(deadline))
                conn, _ = self._srv.accept()
            except TimeoutError:
                raise MetraleError(f"{where}: no trainer connected to {self.path} in time") \
                    from None
            if wire.peer_uid(conn) != os.getuid():
                conn.close()            # another user's process: not ours to lend to
                continue
            conn.setblocking(True)
            self._conn, self._table_sent = conn, False
            return

    def _drop(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self):
        """Close the connection and the socket, and remove its path (idempotent)."""
        self._drop()
        if self._srv is not None:
            self._srv.close()
            self._srv = None
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class MappedWeights:
    """The engine's weights mapped in the trainer for one refit
    (`WeightImport.mapped` makes it), valid inside its ``with`` block only.

    Parameters
    ----------
    ws : WeightSet
        The engine's weight set.
    base : int
        The weights buffer's address in this process.

    Attributes
    ----------
    ws : WeightSet
        The engine's weight set: each parameter's offset, dtype and shape.
    """

    __slots__ = ("ws", "_base", "_open")

    def __init__(self, ws, base):
        self.ws, self._base, self._open = ws, base, True

    def ptr(self, name=None):
        """The device address of a parameter in this process.

        Parameters
        ----------
        name : str, optional
            The parameter (None: the weights buffer, ``ws.nbytes`` bytes).

        Returns
        -------
        int

        Raises
        ------
        KeyError
            `name` is not in the weight set.
        MetraleError
            The block has ended: the memory is unmapped.
        """
        if not self._open:
            raise MetraleError("MappedWeights.ptr: the refit is over and the engine's weights "
                               "are unmapped here")
        return self._base if name is None else self._base + self.ws[name].offset


class WeightImport:
    """The trainer's side: an engine's weights, written in place by name.

    Parameters
    ----------
    path : str or os.PathLike
        The engine's `WeightExport` socket (waited for until `timeout`).
    gpu : Backend
        The same device as the engine's (``CudaBackend(i)``; ``HostBackend``
        for an engine on the host backend).
    timeout : float, optional
        Seconds to wait for the socket.

    Attributes
    ----------
    ws : WeightSet or None
        The engine's weight set, from its first offer.
    epoch : int or None
        The weights' epoch that the last offer named (the refit makes it one
        more).
    """

    def __init__(self, path, gpu, *, timeout=DEFAULT_TIMEOUT):
        where = "WeightImport"
        path = _path_arg(path, where)
        if not isinstance(gpu, Backend):
            raise TypeError(f"{where}: gpu must be a backend (CudaBackend or HostBackend), got "
                            f"{type(gpu).__name__}")
        deadline = time.monotonic() + seconds_arg(timeout, f"{where}: timeout")
        self.gpu, self.path, self.ws, self.epoch = gpu, path, None, None
        self._offered = None
        self._writing = False       # _take: a copy of this sync's may have begun
        self._dtypes = {}           # torch dtype -> the weight set's name for it, once met
        self._slabs, self._chunks, self._span, self._base = PeerSlabs(gpu), None, 0, 0
        self._conn = None
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                s.settimeout(wire.left(deadline))
                s.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                s.close()
                time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                s.close()
                raise MetraleError(f"{where}: no engine listens at {path}") from None
            except BaseException:
                s.close()
                raise
        s.setblocking(True)
        self._conn = s

    def sync(self, state, *, stream=None, timeout=DEFAULT_TIMEOUT):
        """Write every weight of the engine from `state`, then commit.

        Waits for the engine's offer (its `WeightExport.sync`), checks `state`
        against the weight set (every name, element type and shape: a missing,
        extra or mismatched tensor is refused, naming it, before anything is
        mapped or written), maps the engine's memory chunk by chunk (the same
        addresses at every sync), copying each run of tensors that lie back to
        back both in one source storage and in the arena as soon as the chunks
        under it are mapped (on CUDA up to 128 runs a kernel launch), waits for
        the device, unmaps, and commits.

        Parameters
        ----------
        state : mapping
            Names to torch tensors (on this device, contiguous, no lazy
            conjugate or negative view) or, on the host backend, numpy arrays
            (C-contiguous).
        stream : stream, optional
            The stream the copies go on (an int handle, a torch or CuPy stream,
            an object of the CUDA stream protocol; None: the legacy default
            stream).
        timeout : float, optional
            Seconds to wait for the engine's offer.

        Returns
        -------
        LoadStats

        Raises
        ------
        TypeError, ValueError
            `state` is not the weight set's (named): the engine is told the
            refit aborted; nothing was written.
        MetraleError
            The engine went away, or a map, a copy or the unmap failed (the
            engine is told, and whether a copy had begun: the weights may be
            partly written).
        """
        where = "WeightImport.sync"
        deadline = time.monotonic() + seconds_arg(timeout, f"{where}: timeout")
        stream = stream_handle(stream)          # converted before anything is received
        offer, fds = self._offer(where, deadline)
        try:
            ws, runs = self._take(offer, fds, state, where, stream)
            self._slabs.detach()            # waits for the device, then unmaps
        except BaseException as e:
            self._abort(e, self._writing)
            raise
        self._commit(offer, sum(r[3] for r in runs), len(runs))
        return LoadStats(len(ws.params), sum(p.nbytes for p in ws.params), len(runs))

    @contextlib.contextmanager
    def mapped(self, *, timeout=DEFAULT_TIMEOUT):
        """The engine's weights mapped here for one refit by the trainer's own
        kernels: ``with imp.mapped() as w:`` launch them on ``w.ptr(name)``.

        Waits for the engine's offer and maps its memory (the same addresses
        at every refit).  At the end of the block waits for the device (every
        stream), unmaps, and commits; if the block raises, the engine is told
        the refit aborted and that the weights may be partly written.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait for the engine's offer.

        Yields
        ------
        MappedWeights
            The weights' addresses, valid inside the block only: a kernel
            that keeps one past it faults (the memory is unmapped).

        Raises
        ------
        MetraleError
            No offer came (the engine went away), or the unmap failed.
        """
        where = "WeightImport.mapped"
        deadline = time.monotonic() + seconds_arg(timeout, f"{where}: timeout")
        offer, fds = self._offer(where, deadline)
        written = False
        try:
            ws, _runs = self._take(offer, fds)
            w = MappedWeights(ws, self._base + offer["offset"])
            written = True
            try:
                yield w
            finally:
                w._open = False
            self._slabs.detach()
        except BaseException as e:
            self._abort(e, written)
            raise
        self._commit(offer, ws.nbytes, 0)

    def _offer(self, where, deadline):
        """The engine's offer and its descriptors; the import closed if none came."""
        if self._conn is None:
            raise MetraleError(f"{where}: the import is closed")
        try:
            offer = wire.recv(self._conn, deadline)
            if offer["kind"] != "offer":
                raise ConnectionError(f"expected an offer, got {offer['kind']!r}")
            return offer, wire.recv_fds(self._conn, len(offer["chunks"]), deadline)
        except (OSError, ConnectionError) as e:
            self.close()
            raise MetraleError(f"{where}: no offer from the engine ({type(e).__name__}: "
                               f"{e})") from e

    def _take(self, offer, fds, state=None, where=None, stream=None):
        """The offer's weight set and, for a `state`, its runs (every tensor
        checked first: `check_state`), copied on `stream` as the engine's
        memory is mapped, chunk by chunk; without one (None), the memory
        mapped.  The descriptors closed whatever happens; `_writing` says
        whether a copy may have begun."""
        self._writing = False
        try:
            ws = self._weight_set(offer)
            runs = None
            if state is not None:
                runs = runs_of(check_state(ws, state, offer["offset"], where, self.gpu,
                                           self._dtypes))
            self._map([tuple(c) for c in offer["chunks"]], offer["span"], fds,
                      None if runs is None else [(d, s, n) for d, _k, s, n in runs], stream)
        finally:
            wire.close_all(fds)
        return ws, runs

    def _abort(self, e, written):
        try:
            self._slabs.detach()
        except Exception:
            pass
        try:
            wire.send(self._conn, {"kind": "abort", "error": f"{type(e).__name__}: {e}",
                                   "written": written})
        except OSError:
            pass

    def _commit(self, offer, nbytes, copies):
        wire.send(self._conn, {"kind": "commit", "bytes": nbytes, "copies": copies})
        self.epoch = offer["epoch"]

    def _weight_set(self, offer):
        key = [offer[k] for k in ("align", "buffer", "tag", "wake", "nbytes")]
        if offer["params"] is None:     # the table of this connection's first offer
            if self.ws is None or key != self._offered:
                raise MetraleError("WeightImport: the engine's offer names no weight set, and "
                                   "differs from the last one that did (another version?)")
            return self.ws
        ws = WeightSet([(n, d, tuple(s)) for n, d, s in offer["params"]], align=offer["align"],
                       buffer=offer["buffer"], tag=offer["tag"], wake=offer["wake"])
        if ws.nbytes != offer["nbytes"]:
            raise MetraleError("WeightImport: the engine's weight set does not lay out as "
                               "this metrale lays it out (another version?)")
        self.ws, self._offered = ws, key
        return ws

    def _map(self, chunks, span, fds, runs=None, stream=None):
        if self._chunks is not None and (chunks, span) != (self._chunks, self._span):
            self._slabs.close()             # the engine's memory was cut otherwise: anew
            self._slabs, self._chunks = PeerSlabs(self.gpu), None
        if self._chunks is None:            # the reservation, kept from then on
            self._base = self._slabs.map_peer(_KEY, span, [], [])
            self._chunks, self._span = chunks, span
        # the same addresses at every sync; the runs copied as their chunks come
        begun = self._slabs.copies_begun
        try:
            self._slabs.remap_peer(_KEY, chunks, fds, runs, stream)
        finally:
            self._writing = self._slabs.copies_begun != begun

    def close(self):
        """Unmap everything and close the connection (idempotent)."""
        try:
            self._slabs.close()
        finally:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
