"""The trainer's tensors checked against the engine's weight set before a refit
writes anything (metrale.refit's `WeightImport`): every name, element type,
shape, layout (contiguous, no lazy conjugate or negative view: the refit
copies bytes) and device; the copies' items of those that pass."""

import sys

from .weights import _array_kind, _check_names, _described, _mismatch

__all__ = ["check_state"]


def check_state(ws, state, base, where, gpu, dtypes):
    """[(offset from the import's base, source storage, source address,
    bytes)] sorted, every tensor checked first.

    A torch tensor of the weight set's element type (met before: `dtypes`)
    and shape, contiguous, no lazy conjugate or negative view, and on
    `gpu`'s device, takes a few attribute reads; any other goes the long
    way, which names what is wrong.

    Parameters
    ----------
    ws : WeightSet
        The engine's weight set.
    state : mapping
        Names to torch tensors or, on the host backend, numpy arrays.
    base : int
        The weights buffer's offset in the import.
    where : str
        The caller, for the errors.
    gpu : Backend
        The trainer's backend (its device type and id).
    dtypes : dict
        torch dtype -> the weight set's name for it, filled here as met.

    Returns
    -------
    list of (int, int, int, int)

    Raises
    ------
    TypeError, ValueError
        `state` is not the weight set's, naming the tensor.
    """
    if not hasattr(state, "keys") or not hasattr(state, "__getitem__"):
        raise TypeError(f"{where}: state must be a mapping of names to tensors, got "
                        f"{type(state).__name__}")
    names = list(state.keys())
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"{where}: a tensor's name must be a str")
    _check_names(where, ws, names)
    host = gpu.device_type == 1          # DLPack's kDLCPU: the host backend
    device = gpu.device_id
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    items = []
    for name in names:
        p, v = ws[name], state[name]
        if (not host and tensor is not None and isinstance(v, tensor)
                and dtypes.get(v.dtype) == p.dtype and v.shape == p.shape
                and v.is_cuda and v.get_device() == device and v.is_contiguous()
                and not v.is_neg() and not v.is_conj()):
            ptr = v.data_ptr()          # its storage: where the tensor's offset starts
            items.append((base + p.offset, ptr - v.storage_offset() * v.element_size(), ptr,
                          p.nbytes))
        else:
            items.append((base + p.offset, *_item(where, name, p, v, gpu, dtypes), p.nbytes))
    items.sort()
    return items


def _item(where, name, p, v, gpu, dtypes):
    """(source storage, source address) of one tensor, checked."""
    host = gpu.device_type == 1
    at = f"{where}: tensor {name!r}"
    kind = _array_kind(v)
    if kind is None:
        raise TypeError(f"{at} must be a torch tensor or a numpy array, got "
                        f"{type(v).__name__}")
    dtype, shape = _described(v, at)
    if (dtype, shape) != (p.dtype, p.shape):
        _mismatch(where, name, dtype, shape, p)
    if kind == "numpy":
        if not host:
            raise ValueError(f"{at} is a numpy array: the engine's weights are on "
                             "the GPU (give a torch tensor on it)")
        if not v.flags.c_contiguous:
            raise ValueError(f"{at} is not C-contiguous")
        root = v
        while getattr(root, "base", None) is not None:
            root = root.base
        return id(root), v.ctypes.data
    if not v.is_contiguous():
        raise ValueError(f"{at} is not contiguous")
    if v.is_conj() or v.is_neg():       # lazy: the bytes are not yet the values
        raise ValueError(f"{at} is a lazy {'conjugate' if v.is_conj() else 'negative'} view: "
                         "its bytes are not its values (resolve_conj() / resolve_neg() first)")
    dev = v.device
    if host != (dev.type == "cpu") or (not host and dev.index != gpu.device_id):
        raise ValueError(f"{at} is on {dev}, the engine's weights on "
                         f"{'the host' if host else f'cuda:{gpu.device_id}'}")
    dtypes[v.dtype] = dtype             # checked: the short way takes it from now on
    return v.untyped_storage().data_ptr(), v.data_ptr()
