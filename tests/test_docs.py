"""The documentation a user reads in help(), an IDE or the API reference.

Every public class, function, method and property of the package has a
docstring; a callable that takes arguments documents them in a numpydoc
"Parameters" section; public attributes without a docstring of their own
(``__slots__`` fields, Cython ``readonly`` members) are listed in the
"Attributes" section of their class; the Cython classes expose
``inspect.signature`` for their methods and public constructors; and no
docstring points at the team's internal specification.

"Public" means no leading underscore.  Only what a class defines itself (its
own ``__dict__``) is checked, not what it inherits from object or Mapping.
"""

import ast
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest

import metrale

# Importing metrale.__main__ runs the command line.
_NOT_IMPORTED = {"metrale.__main__"}
_FORBIDDEN = ("ARENA.md", "API.md", "\u00a7")
_HEAPTYPE = 1 << 9          # Py_TPFLAGS_HEAPTYPE: clear for Cython extension types
_SOURCES = Path(__file__).resolve().parents[1] / "src" / "metrale"


def _modules():
    """Every importable module of the package, the package first (without
    cuda-bindings, metrale._backends._cuda is not: see the fallback test)."""
    from helpers import package_modules
    return package_modules()


MODULES = _modules()


def _is_routine(obj):
    return inspect.isroutine(obj) or isinstance(obj, (classmethod, staticmethod))


def _public_objects():
    """(qualified name, object) of every public class and function: the names
    of each module's __all__ (the package's included) and every public class or
    function a module defines, each once."""
    found, seen = [], set()

    def add(obj):
        if (inspect.isclass(obj) or _is_routine(obj)) and id(obj) not in seen:
            seen.add(id(obj))
            found.append((f"{obj.__module__}.{obj.__qualname__}", obj))

    for mod in MODULES:
        for name in getattr(mod, "__all__", ()):
            add(getattr(mod, name))                 # imports each public name
        for name, obj in vars(mod).items():
            if not name.startswith("_") and getattr(obj, "__module__", None) == mod.__name__:
                add(obj)
    extra = [metrale.CudaBackend, metrale.levers.Lever, metrale.sizes.Target,
             importlib.import_module("metrale.testing").FaultyBackend,
             importlib.import_module("metrale._backends._backend").Backend]
    for obj in extra:
        add(obj)
    return found


PUBLIC = _public_objects()
CLASSES = [(n, c) for n, c in PUBLIC if inspect.isclass(c) and not c.__name__.startswith("_")]
FUNCTIONS = [(n, f) for n, f in PUBLIC if not inspect.isclass(f) and not f.__name__.startswith("_")]
EXTENSION_TYPES = [(n, c) for n, c in CLASSES if not c.__flags__ & _HEAPTYPE]


def _own_doc(obj):
    """The object's own docstring, cleaned; "" when it has none.  Unlike
    inspect.getdoc, never the docstring of a base class."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
    elif isinstance(obj, (classmethod, staticmethod)):
        doc = obj.__func__.__doc__
    else:
        doc = getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def _section(doc, title):
    """The body of numpydoc section `title` in a cleaned docstring, or None."""
    lines = doc.splitlines()

    def heading(i):
        return (i + 1 < len(lines) and lines[i].strip() and lines[i] == lines[i].lstrip()
                and re.fullmatch(r"-{3,}", lines[i + 1].strip()) is not None)

    for i in range(len(lines)):
        if heading(i) and lines[i].strip() == title:
            end = i + 2
            while end < len(lines) and not heading(end):
                end += 1
            return "\n".join(lines[i + 2:end])
    return None


def _listed_attributes(cls):
    """Names listed in the Attributes sections of `cls` and its bases."""
    names = set()
    for base in cls.__mro__:
        body = _section(_own_doc(base), "Attributes") or ""
        for line in body.splitlines():
            if line and line == line.lstrip():
                names.update(n.strip() for n in line.split(" :")[0].split(","))
    return names


def _parameters(call, skip_self):
    """Parameter names of `call`, or None when it has no signature."""
    try:
        params = list(inspect.signature(call).parameters.values())
    except (TypeError, ValueError):
        return None
    if skip_self and params and params[0].name in ("self", "cls"):
        params = params[1:]
    return [p.name for p in params]


def _members(cls):
    """(name, raw attribute) of the public names `cls` defines itself."""
    return [(n, v) for n, v in vars(cls).items() if not n.startswith("_")]


def _is_data_descriptor(raw):
    return isinstance(raw, property) or inspect.isdatadescriptor(raw) \
        or inspect.ismemberdescriptor(raw) or inspect.isgetsetdescriptor(raw)


def _problems_of_class(cls):
    problems = []
    doc = _own_doc(cls)
    if not doc:
        problems.append("the class has no docstring")
    else:
        try:
            sig = inspect.signature(cls)
        except (TypeError, ValueError):
            sig = None          # a private constructor: nothing to document
        named = [p for p in sig.parameters.values()
                 if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)] if sig else []
        if named and _section(doc, "Parameters") is None:
            problems.append("the class docstring has no Parameters section for "
                            f"{', '.join(p.name for p in named)}")
    listed = None
    for name, raw in _members(cls):
        if _is_routine(raw):
            mdoc = _own_doc(raw)
            if not mdoc:
                problems.append(f"{name}(): no docstring")
                continue
            params = _parameters(getattr(cls, name), not isinstance(raw, staticmethod))
            if params and _section(mdoc, "Parameters") is None:
                problems.append(f"{name}(): no Parameters section for {', '.join(params)}")
        elif _is_data_descriptor(raw):
            if _own_doc(raw):
                continue
            if listed is None:
                listed = _listed_attributes(cls)
            if name not in listed:
                problems.append(f"{name}: neither a docstring nor an entry in the class's "
                                "Attributes section")
    return problems


def _where(obj):
    """The source file that defines `obj`, for the failure messages."""
    rel = Path(*obj.__module__.split(".")[1:])
    for ext in (".py", ".pyx", ".pyx.in"):
        path = _SOURCES / rel.with_name(rel.name + ext)
        if path.is_file():
            return f"src/metrale/{path.relative_to(_SOURCES)}"
    return obj.__module__


@pytest.mark.parametrize("name,cls", CLASSES, ids=[n for n, _ in CLASSES])
def test_class_is_documented(name, cls):
    problems = _problems_of_class(cls)
    assert not problems, f"{name} ({_where(cls)}):\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("name,func", FUNCTIONS, ids=[n for n, _ in FUNCTIONS])
def test_function_is_documented(name, func):
    doc = _own_doc(func)
    assert doc, f"{name} ({_where(func)}) has no docstring"
    # A first parameter `self`: a concept's method that BufferArena binds.
    params = _parameters(func, True)
    if params:
        assert _section(doc, "Parameters") is not None, \
            f"{name} ({_where(func)}): no Parameters section for {', '.join(params)}"


# Methods Cython adds for pickling, which refuses these objects anyway.
_CYTHON_PICKLING = ("__reduce__", "__reduce_cython__", "__setstate__", "__setstate_cython__")


def _cython_methods(cls):
    """The public methods of an extension type, and the protocol methods it
    defines with ``def`` (``__dlpack__``, ``__enter__``): the slot wrappers
    (``__repr__``) and the pickling methods Cython adds are left out."""
    for attr, raw in vars(cls).items():
        if not _is_routine(raw) or attr in _CYTHON_PICKLING:
            continue
        if not attr.startswith("_") or (attr.startswith("__") and attr.endswith("__")
                                        and type(raw).__name__ == "method_descriptor"):
            yield attr


@pytest.mark.parametrize("name,cls", EXTENSION_TYPES, ids=[n for n, _ in EXTENSION_TYPES])
def test_cython_methods_have_signatures(name, cls):
    """embedsignature gives every method of a Cython class a text signature,
    and every stream argument defaults to None (the legacy default stream)."""
    problems = []
    for attr in _cython_methods(cls):
        try:
            sig = inspect.signature(getattr(cls, attr))
        except (TypeError, ValueError) as e:
            problems.append(f"{attr}(): no signature ({e})")
            continue
        stream = sig.parameters.get("stream")
        if stream is not None and stream.default is not None:
            problems.append(f"{attr}(): stream defaults to {stream.default!r}, not None")
    assert not problems, f"{name} ({_where(cls)}):\n  " + "\n  ".join(problems)


def test_cython_classes_are_all_checked():
    names = {c.__name__ for _, c in EXTENSION_TYPES}
    assert {"BufferArena", "ScratchSpaceManager", "ScratchSpace", "HostBackend", "Backend",
            "ArenaView", "FaultyBackend", "SlabPlan"} <= names


def _constructors():
    from metrale._backends._host_backend import HostBackend
    from metrale._backends._scratch import ScratchSpaceManager
    from metrale.testing import FaultyBackend
    cases = [(HostBackend, []), (FaultyBackend, ["maps_over", "fresh"]),
             (ScratchSpaceManager, ["scratch_size", "max_threads"])]
    try:
        from metrale._backends._cuda import CudaBackend
    except ImportError:
        pass
    else:
        cases.append((CudaBackend, ["device"]))
    return cases


CONSTRUCTORS = _constructors()


@pytest.mark.parametrize("cls,params", CONSTRUCTORS, ids=[c.__name__ for c, _ in CONSTRUCTORS])
def test_constructor_signature(cls, params):
    """The class docstring starts with the Argument Clinic signature line, so
    that inspect.signature and help() show how to construct it."""
    sig = inspect.signature(cls)
    assert list(sig.parameters) == params
    assert not cls.__doc__.startswith(cls.__name__ + "(")     # the signature line is stripped


def test_cuda_backend_default_device():
    try:
        from metrale._backends._cuda import CudaBackend
    except ImportError:
        pytest.skip("metrale._backends._cuda is not importable here")
    assert inspect.signature(CudaBackend).parameters["device"].default == 0


def test_unavailable_cuda_backend_is_documented():
    """The stand-in metrale.cuda defines where the CUDA extension cannot load."""
    spec = importlib.util.find_spec("metrale._backends.cuda")
    saved = sys.modules.get("metrale._backends._cuda", ...)
    sys.modules["metrale._backends._cuda"] = None          # makes `from metrale._backends._cuda import` fail
    try:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        if saved is ...:
            del sys.modules["metrale._backends._cuda"]
        else:
            sys.modules["metrale._backends._cuda"] = saved
    cls = mod.CudaBackend
    assert cls.__module__ == "metrale._backends.cuda"
    assert list(inspect.signature(cls).parameters) == ["device"]
    assert _problems_of_class(cls) == []
    assert _section(_own_doc(cls), "Parameters") is not None
    with pytest.raises(metrale.MetraleError, match="CudaBackend is unavailable"):
        cls()


def _all_docstrings():
    """(where, docstring) of every module, class, function, method and
    property of the package, private ones included."""
    out = []

    def visit_class(prefix, cls):
        out.append((prefix, cls.__dict__.get("__doc__")))
        for name, raw in vars(cls).items():
            if name == "__doc__":
                continue
            if isinstance(raw, (classmethod, staticmethod)):
                raw = raw.__func__
            if _is_routine(raw) or _is_data_descriptor(raw):
                doc = getattr(raw, "__doc__", None)
                if isinstance(doc, str):
                    out.append((f"{prefix}.{name}", doc))

    for mod in MODULES:
        out.append((mod.__name__, mod.__doc__))
        for name, obj in vars(mod).items():
            if getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isclass(obj):
                visit_class(f"{mod.__name__}.{name}", obj)
            elif _is_routine(obj):
                out.append((f"{mod.__name__}.{name}", obj.__doc__))
    for name in _NOT_IMPORTED:
        source = importlib.util.find_spec(name).loader.get_source(name)
        if source is not None:
            out.append((name, ast.get_docstring(ast.parse(source))))
    return [(w, d) for w, d in out if isinstance(d, str)]


def test_no_docstring_cites_the_internal_spec():
    """Docstrings explain in words; they never send the reader to the team's
    specification files or their numbered sections."""
    bad = [f"{where}: {word!r}" for where, doc in _all_docstrings()
           for word in _FORBIDDEN if word in doc]
    assert not bad, "docstrings citing the internal specification:\n  " + "\n  ".join(bad)


def test_the_walk_reaches_the_public_api():
    names = {n for n, _ in PUBLIC}
    for expected in ("metrale._sizing.config.ModelConfig", "metrale._sizing.sizes.BufferSizes",
                     "metrale._sizing.target.Target", "metrale._sizing.levers.Lever",
                     "metrale._sizing.levers.lever_on", "metrale._backends.testing.FaultyBackend",
                     "metrale._arena._buffer_arena.BufferArena",
                     "metrale._backends._host_backend.HostBackend",
                     "metrale._base.errors.MetraleError"):
        assert expected in names
    for name in metrale.__all__:
        obj = getattr(metrale, name)
        if inspect.isclass(obj):
            assert f"{obj.__module__}.{obj.__qualname__}" in names


# -- the repository's pages: README -> docs, every link resolves ------------------------

_ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not (_ROOT / "docs" / "index.md").exists(),
                    reason="the docs pages live in the repository, not the installed package")
def test_readme_and_docs_links_resolve():
    import re
    readme = (_ROOT / "README.md").read_text()
    assert "shared/spec" not in readme and "ARENA.md" not in readme
    assert "docs/index.md" in readme and "docs/slab.png" in readme
    pages = [_ROOT / "README.md"] + sorted((_ROOT / "docs").glob("*.md"))
    for page in pages:
        text = page.read_text()
        assert "shared/spec" not in text and "ARENA.md" not in text, page.name
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if target.startswith(("http://", "https://")):
                continue
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
    index = (_ROOT / "docs" / "index.md").read_text()
    for name in ("quickstart.md", "buffers.md", "levers.md", "lifetime.md", "streams.md",
                 "backends.md", "cli.md"):
        assert f"({name})" in index, name
