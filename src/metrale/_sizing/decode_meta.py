"""The byte layout of the batched-decode metadata inside the `scratch` buffer
(`DecodeMetaLayout`), the KV blocks per sequence its block table holds, and
where the step inputs' token count sits ahead of it: what the sizing reserves
(`metrale.sizes`) and what `StepInputs` uploads (metrale/_arena/_step.pyx).
``metrale.sizes.DecodeMetaLayout`` is this class.
"""

from .._base._common import check_index

__all__ = ["DecodeMetaLayout", "DECODE_META_MIN_ROWS", "DECODE_META_MAX_ROWS",
           "kv_blocks_per_seq"]

DECODE_META_MIN_ROWS = 32
DECODE_META_MAX_ROWS = 128
_DECODE_META_OFFSET = 32_768   # batched decode / verify metadata inside `scratch`
# The int32 token count StepInputs uploads: the last 16 bytes before the decode
# metadata, inside the 32 KiB the sizing reserves ahead of it.
_STEP_COUNT_OFFSET = _DECODE_META_OFFSET - 16


class DecodeMetaLayout:
    """Byte layout of the batched-decode metadata upload.

    The engine uploads one packed table per batched decode step, at offset
    32,768 of the ``scratch`` buffer: for each of the R rows the position
    (uint32), the LoRA slot (int32), the KV slot (int64) and the sequence
    length (int32), each as one array of R entries, then, after an unused
    gap of 4R bytes, the block table (int32, R rows of ``max_blocks``).  An
    arena keeps the layout of the ``max_batch_size`` it was built for
    (``arena.decode_meta()``).  Layouts compare and hash by their rows.

    Parameters
    ----------
    rows : int
        R, the widest padded batch the upload holds (>= 0), taken as is;
        `for_max_batch_size` applies the 32-row floor.

    Raises
    ------
    TypeError
        `rows` is not an int.
    ValueError
        `rows` is negative or does not fit 64 bits.
    """

    __slots__ = ("_rows",)

    def __init__(self, rows):
        self._rows = check_index(rows, "rows")

    @classmethod
    def for_max_batch_size(cls, n):
        """The layout for batches of up to `n` sequences.

        Parameters
        ----------
        n : int
            The serving limit on sequences per decode step (>= 0).

        Returns
        -------
        DecodeMetaLayout
            The layout of ``max(n, DECODE_META_MIN_ROWS)`` rows.  Only the
            32-row floor applies: DECODE_META_MAX_ROWS is a ceiling for front
            ends to enforce, not a clamp.

        Raises
        ------
        TypeError
            `n` is not an int.
        ValueError
            `n` is negative or does not fit 64 bits.
        """
        n = check_index(n, "max_batch_size")
        return cls(max(n, DECODE_META_MIN_ROWS))

    def rows(self):
        """R, the rows the upload holds.

        Returns
        -------
        int
            The widest padded batch.
        """
        return self._rows

    def positions_offset(self):
        """Byte offset of the positions (uint32, R entries).

        Returns
        -------
        int
            Always 0.
        """
        return 0

    def seq_slot_offset(self):
        """Byte offset of the per-sequence LoRA slots (int32, R entries).

        Returns
        -------
        int
            4R.
        """
        return 4 * self._rows

    def slots_offset(self):
        """Byte offset of the KV slots (int64, R entries; 8-byte aligned).

        Returns
        -------
        int
            8R.
        """
        return 8 * self._rows

    def seq_lens_offset(self):
        """Byte offset of the sequence lengths (int32, R entries).

        Returns
        -------
        int
            16R.
        """
        return 16 * self._rows

    def block_table_offset(self):
        """Byte offset of the block table (int32, R rows of max_blocks).

        The 4R bytes before it, after the sequence lengths, are unused.

        Returns
        -------
        int
            24R.
        """
        # 4R gap after the sequence lengths, as the reference packs it.
        return 24 * self._rows

    def meta_bytes(self, max_blocks):
        """Size of the whole upload for a block table `max_blocks` wide.

        Parameters
        ----------
        max_blocks : int
            KV blocks per sequence in the block table (>= 0).

        Returns
        -------
        int
            ``24 * R + 4 * R * max_blocks``.

        Raises
        ------
        TypeError
            `max_blocks` is not an int.
        ValueError
            `max_blocks` is negative or does not fit 64 bits.
        """
        max_blocks = check_index(max_blocks, "max_blocks")
        return 24 * self._rows + 4 * self._rows * max_blocks

    def __eq__(self, other):
        if type(other) is not DecodeMetaLayout:
            return NotImplemented
        return self._rows == other._rows

    def __hash__(self):
        return hash(("DecodeMetaLayout", self._rows))

    def __repr__(self):
        return f"DecodeMetaLayout(rows={self._rows})"


def kv_blocks_per_seq(max_seq_len, kv_block_size):
    """KV blocks per sequence in the block tables (B).

    Parameters
    ----------
    max_seq_len : int
        Longest sequence the KV cache serves.
    kv_block_size : int
        Tokens per paged-KV block; 0 means 256 blocks.

    Returns
    -------
    int
        ``max_seq_len // kv_block_size + 1``, or 256 when `kv_block_size` is 0.
    """
    return 256 if kv_block_size == 0 else max_seq_len // kv_block_size + 1
