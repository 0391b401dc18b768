"""The one rule for integer arguments and the one for streams, seen through
every public entry point that takes them."""

import re

import pytest

import metrale
from metrale import (BufferArena, BufferSizes, DecodeMetaLayout, HostBackend, ModelConfig,
                     ScratchSpaceManager, Target)
from metrale._base._common import check_index
from metrale.moe import moe_fp8_layout
from metrale.sizes import BUFFER_NAMES
from metrale.testing import FaultyBackend

from helpers import COMPACT, NOENV, PRESET, AttrStream, ProtoStream, new

np = pytest.importorskip("numpy")


def test_check_index_rule():
    assert check_index(5, "x") == 5 and type(check_index(np.int64(5), "x")) is int
    assert check_index(np.uint64(2**64 - 1), "x") == 2**64 - 1
    for bad in (True, np.True_, 1.0, "1", None, np.float32(1), [1]):
        with pytest.raises(TypeError, match="x must be an int"):
            check_index(bad, "x")
    with pytest.raises(ValueError, match=r"x must be >= 0, got -5"):
        check_index(-5, "x")
    with pytest.raises(ValueError, match=r"x must be >= 3, got 2"):
        check_index(2, "x", 3)
    with pytest.raises(ValueError, match=r"x must fit in 64 bits"):
        check_index(2**64, "x")
    with pytest.raises(ValueError, match=r"x must be <= 7"):
        check_index(8, "x", 0, 7)
    with pytest.raises(ValueError, match=r"an int of 100001 bits"):   # no str() of a huge int
        check_index(2**100000, "x")


# Every integer argument of the public API, as (call taking the value, name in the message).
_ARENA = {}


def _arena():
    if "a" not in _ARENA:
        gpu = HostBackend()
        sizes = BufferSizes.from_config(COMPACT, 64, 4096, 16, 32, env={"METRALE_FP8_ROWWISE": "1"})
        _ARENA["gpu"] = gpu
        _ARENA["a"] = BufferArena.from_sizes(sizes, gpu)
    return _ARENA["a"], _ARENA["gpu"]


INT_ARGS = [
    (lambda v: BufferSizes.from_config(PRESET, v, 4096, 16, 32, env=NOENV), "max_batch_tokens"),
    (lambda v: BufferSizes.from_config(PRESET, 8, v, 16, 32, env=NOENV), "max_seq_len"),
    (lambda v: BufferSizes.from_config(PRESET, 8, 4096, v, 32, env=NOENV), "kv_block_size"),
    (lambda v: BufferSizes.from_config(PRESET, 8, 4096, 16, v, env=NOENV), "max_batch_size"),
    (lambda v: BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0)).replace(logits=v), "logits"),
    (lambda v: ModelConfig(hidden_size=v), "hidden_size"),
    (lambda v: Target(v, "auto"), "sm_count"),
    (lambda v: DecodeMetaLayout.for_max_batch_size(v), "max_batch_size"),
    (lambda v: DecodeMetaLayout.for_max_batch_size(8).meta_bytes(v), "max_blocks"),
    (lambda v: moe_fp8_layout(PRESET, v), "rows"),
    (lambda v: BufferArena.new(PRESET, v, 4096, 16, 32, HostBackend()), "max_batch_tokens"),
    (lambda v: BufferArena.from_sizes(PRESET, BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0)),
                                      1, v, HostBackend()), "max_batch_size"),
    (lambda v: _arena()[0].zero_all_rows(_arena()[1], 0, v), "tokens"),
    (lambda v: _arena()[0].take_ssm_rowwise_w_bf16(v), "bytes"),
    (lambda v: _arena()[0].view("hidden_states", "uint8", (v,)), "shape"),
    (lambda v: ScratchSpaceManager(v, 1), "scratch_size"),
    (lambda v: ScratchSpaceManager(8, v), "max_threads"),
    (lambda v: ScratchSpaceManager.for_model(v, 1), "hidden_dim"),
    (lambda v: FaultyBackend().inject_fault("alloc", v), "nth"),
]


@pytest.mark.parametrize("call, name", INT_ARGS, ids=[f"{i}-{n}" for i, (_, n) in enumerate(INT_ARGS)])
def test_every_integer_argument(call, name):
    call(np.int32(1))                                       # __index__ objects are ints
    call(np.uint64(1))
    for bad in (True, 1.5, "1", np.float64(1.0)):
        with pytest.raises(TypeError, match=name):
            call(bad)
    for bad in (-1, 2**64, -2**70):
        with pytest.raises(ValueError, match=name):
            call(bad)


def test_kv_block_size_2_64_is_refused():
    # was accepted silently: the 2**64 in B = max_seq_len // kv_block_size + 1 is 0 blocks
    with pytest.raises(ValueError, match="kv_block_size must fit in 64 bits"):
        BufferSizes.from_config(PRESET, 8, 4096, 2**64, 32, env=NOENV)


def test_numpy_integers_size_the_same():
    a = BufferSizes.from_config(PRESET, np.int64(64), np.int32(4096), np.uint16(16), np.int8(32),
                                env=NOENV)
    assert a == BufferSizes.from_config(PRESET, 64, 4096, 16, 32, env=NOENV)
    c = ModelConfig(**{k: np.int64(v) if type(v) is int else v for k, v in PRESET.as_dict().items()})
    assert c == PRESET and all(type(getattr(c, k)) is int for k in ("hidden_size", "vocab_size"))


# -- streams ------------------------------------------------------------------------------

GOOD_STREAMS = [None, 0, 7, 2**64 - 1, np.uint64(5), ProtoStream((0, 3)), ProtoStream((0, np.int64(3))),
                AttrStream(cuda_stream=9), AttrStream(ptr=11)]
BAD_STREAMS = [
    (-5, ValueError, "stream must be >= 0"),
    (2**64, ValueError, "stream must fit in 64 bits"),
    (True, TypeError, "stream"),
    (1.0, TypeError, "stream"),
    ("0", TypeError, "stream"),
    (object(), TypeError, "stream"),
    (ProtoStream((1, 3)), ValueError, "protocol version 1"),
    (ProtoStream((0,)), TypeError, r"stream.__cuda_stream__\(\) must return a \(version, handle\)"),
    (ProtoStream([0, 3]), TypeError, "must return a"),
    (ProtoStream(("0", 3)), TypeError, "version must be an int"),
    (ProtoStream((0, 3.0)), TypeError, "stream: the handle of __cuda_stream__"),
    (ProtoStream((0, -1)), ValueError, "stream must be >= 0"),
    (ProtoStream((0, 2**64)), ValueError, "stream must fit"),
    (AttrStream(__cuda_stream__=5), TypeError, "stream.__cuda_stream__ must be a method"),
    (AttrStream(cuda_stream="s"), TypeError, "stream.cuda_stream must be an int"),
    (AttrStream(ptr=-1), ValueError, "stream must be >= 0"),
    (AttrStream(ptr=True), TypeError, "stream.ptr"),
]


def _id(x):
    """A test id with no address in it: the same in every process (pytest-xdist)."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(x))


@pytest.mark.parametrize("stream", GOOD_STREAMS, ids=lambda x: _id(x))
def test_good_streams(stream):
    gpu = HostBackend()
    with new(gpu, m=4) as arena:
        arena.zero_all(gpu, stream)
        arena.zero_all_rows(gpu, stream, 1)
        arena.zero_prefill_essentials(gpu, stream)
        gpu.clear_ranges([(arena.hidden_states(), 16)], stream)


@pytest.mark.parametrize("stream, exc, word", BAD_STREAMS, ids=lambda x: _id(x)[:30])
def test_bad_streams_name_the_argument(stream, exc, word):
    gpu = HostBackend()
    with new(gpu, m=4) as arena:
        before = gpu.memset_count
        for call in (lambda: arena.zero_all(gpu, stream),
                     lambda: arena.zero_all_rows(gpu, stream, 1),
                     lambda: arena.zero_prefill_essentials(gpu, stream),
                     lambda: arena.debug_buffer_checksum(gpu, stream, "t"),
                     lambda: gpu.clear_ranges([(arena.hidden_states(), 16)], stream)):
            with pytest.raises(exc, match=word):
                call()
        assert gpu.memset_count == before and gpu.d2h_count == 0


def test_cuda_backend_arguments():
    if metrale.CudaBackend.__module__ != "metrale._backends._cuda":
        pytest.skip("metrale was built without its CUDA extension")
    # checked before any driver call, so also where no driver is installed
    for bad, exc in ((True, TypeError), ("0", TypeError), (-1, ValueError), (2**31, ValueError)):
        with pytest.raises(exc, match="device"):
            metrale.CudaBackend(bad)


# -- durations: one rule and one bound for every timeout --------------------------------------

@pytest.mark.parametrize("bad", [0, -1.0, 86400.5, 4294968, 1e9, 1e300, float("inf"),
                                 float("nan")])
def test_every_timeout_has_one_bound(bad):
    """(0, 86400] seconds for each timeout argument, checked before anything
    happens (1e9 used to fail later inside with OverflowError, 1e300 to pass)."""
    from metrale._base._common import MAX_SECONDS
    from metrale.tp import PeerGroup
    from helpers import OneRank
    assert MAX_SECONDS == 86400.0
    match = r"timeout must be a number of seconds in \(0, 86400\]"
    with pytest.raises(ValueError, match=match):
        PeerGroup(OneRank(), timeout=bad)
    with BufferArena.new(COMPACT, 64, 512, 16, 8, HostBackend(), group=OneRank()) as a:
        a.detach_peers()
        with pytest.raises(ValueError, match=match):
            a.attach_peers(timeout=bad)
        a.attach_peers(timeout=86400)                   # the bound itself is a timeout
        with pytest.raises(ValueError, match=match):
            a.peer_all_reduce("hidden_states", tokens=1, timeout=bad)
        a.peer_all_reduce("hidden_states", tokens=1, timeout=86400)
