"""Record: the one pattern for metrale's small immutable values.

A subclass lists its fields in ``__slots__``; instances are built from
positional or keyword values, compared, hashed and shown by value, and
refuse assignment.  ``_defaults`` gives values for trailing fields that may
be left out (fields added after the first release).  ``_hex`` names the fields shown in hexadecimal (device
addresses).  Plain Python, no imports: the records sit on import paths.
"""

__all__ = ["Record"]


class Record:
    """Base of metrale's small immutable values.

    A subclass lists its fields in ``__slots__``.  An instance compares,
    hashes, pickles and prints by value, and refuses assignment.

    Parameters
    ----------
    *args, **kwargs
        One value per field, positionally in ``__slots__`` order or by name.
        Trailing fields listed in ``_defaults`` may be left out.

    Raises
    ------
    TypeError
        More values than fields, an unknown or repeated field name, or a
        missing field.
    """

    __slots__ = ()
    _hex: "tuple[str, ...]" = ()
    _defaults: "dict[str, object]" = {}

    def __init__(self, *args, **kwargs):
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}() takes {len(names)} values, got {len(args)}")
        values = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names or name in values:
                raise TypeError(f"{type(self).__name__}() got an unexpected or repeated field {name!r}")
            values[name] = value
        if len(values) != len(names):
            for name in names:
                if name not in values and name in self._defaults:
                    values[name] = self._defaults[name]
        if len(values) != len(names):
            missing = [n for n in names if n not in values]
            raise TypeError(f"{type(self).__name__}() missing fields: {', '.join(missing)}")
        for name in names:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is read-only")

    def _values(self):
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self):
        return hash((type(self).__name__,) + self._values())

    def __reduce__(self):
        return (type(self), self._values())

    def __repr__(self):
        shown = (f"{n}={getattr(self, n):#x}" if n in self._hex else f"{n}={getattr(self, n)!r}"
                 for n in self.__slots__)
        return f"{type(self).__name__}({', '.join(shown)})"
