"""The copies of a weight load: runs of back-to-back tensors, written into the
weights buffer of a host or a device arena (metrale._integrations.weights)."""

import ctypes

from .._base.errors import MetraleError

__all__ = ["CHUNK", "Sink", "runs_of"]

# A device arena's load reads a file's bytes in pieces of at most this much.
CHUNK = 64 << 20


def runs_of(items):
    """Copies merged where both sides continue back to back.

    Parameters
    ----------
    items : list of (int, object, int, int)
        ``(destination offset, source key, source offset, bytes)``, sorted by
        destination; a run continues only within one source key.

    Returns
    -------
    list of (int, object, int, int)
    """
    out = []
    for dst, key, src, n in items:
        if out:
            d, k, s, m = out[-1]
            if k == key and d + m == dst and s + m == src:
                out[-1] = (d, k, s, m + n)
                continue
        out.append((dst, key, src, n))
    return out


class Sink:
    """The weights buffer, written at offsets.  It holds a view of the buffer,
    which pins the arena's memory: no release or sleep frees it under a copy.

    Parameters
    ----------
    arena : BufferArena
        The weight arena (awake).
    ws : WeightSet
        Its weight set (the buffer's name).
    stream : stream or None
        For a CUDA arena, the stream of the copies.
    """

    def __init__(self, arena, ws, stream):
        self.gpu, self.stream = arena.backend(), stream
        self.view = arena.view(ws.buffer, "uint8")
        self.upload = getattr(type(self.gpu), "upload", None)   # device memory: its copy
        # host memory: a bounds-checked slice of exactly the buffer's bytes
        self.whole = None if self.upload is not None else memoryview(
            (ctypes.c_uint8 * self.view.nbytes).from_address(self.view.ptr)).cast("B")
        self.buf = None

    def write(self, off, data):
        """Copy `data` (bytes-like) to offset `off` of the buffer.

        Parameters
        ----------
        off : int
        data : memoryview
        """
        if self.whole is not None:
            self.whole[off:off + len(data)] = data
        else:
            self.upload(self.gpu, self.view.ptr + off, data, self.stream)

    def read(self, off, f, src, n, path):
        """n bytes of file f from src, to offset off: read straight into host
        memory, or through one reused buffer of at most CHUNK bytes to the
        device (the backend's upload waits for each piece).  Read, not mapped:
        a file cut short under a map would fault the process.

        Parameters
        ----------
        off : int
            The buffer's offset written.
        f : binary file
        src : int
            The file's offset read.
        n : int
            Bytes.
        path : str
            The file's name (for the error of a file cut short).
        """
        f.seek(src)
        while n:
            if self.whole is not None:
                k, got = n, f.readinto(self.whole[off:off + n])
            else:
                if self.buf is None:
                    self.buf = memoryview(bytearray(CHUNK))
                k = min(n, CHUNK)
                got = f.readinto(self.buf[:k])
                if got == k:
                    self.write(off, self.buf[:k])
            if got != k:
                raise MetraleError(f"load: {path} ended before its tensors' bytes: it changed "
                                   "since its header was read (the weights are partly "
                                   "written: load them again)")
            off, src, n = off + k, src + k, n - k

    def done(self):
        """Wait for the copies (a CUDA arena's stream)."""
        if self.whole is None:
            self.gpu.synchronize(self.stream)
