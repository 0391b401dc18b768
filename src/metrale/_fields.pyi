FIELDS: tuple[str, ...]
