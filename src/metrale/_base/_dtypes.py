"""The element types metrale knows, written once: views (metrale._base._common),
buffer specs (metrale.buffers) and the debug operations read this table.

canonical name -> (array-interface typestr, DLPack type code, bits).  The names
are numpy's, and ml_dtypes' / torch's for the types numpy lacks; the array
interface has no code for those, so it sees raw bytes of their width.  Plain
Python, no imports.
"""

DTYPES = {
    "bool": ("|b1", 6, 8),
    "int8": ("|i1", 0, 8), "int16": ("<i2", 0, 16), "int32": ("<i4", 0, 32),
    "int64": ("<i8", 0, 64),
    "uint8": ("|u1", 1, 8), "uint16": ("<u2", 1, 16), "uint32": ("<u4", 1, 32),
    "uint64": ("<u8", 1, 64),
    "float16": ("<f2", 2, 16), "float32": ("<f4", 2, 32), "float64": ("<f8", 2, 64),
    "complex64": ("<c8", 5, 64), "complex128": ("<c16", 5, 128),
    "bfloat16": ("<V2", 4, 16),
    "float8_e4m3fn": ("|V1", 10, 8), "float8_e5m2": ("|V1", 12, 8),
}

# Bytes per element of each type.
ITEMSIZE = {name: bits // 8 for name, (_, _, bits) in DTYPES.items()}
