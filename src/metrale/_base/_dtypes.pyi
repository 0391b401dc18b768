DTYPES: dict[str, tuple[str, int, int]]
ITEMSIZE: dict[str, int]
