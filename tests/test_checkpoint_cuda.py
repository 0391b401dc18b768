"""metrale.checkpoint on one GPU, for real: an engine process with a reserved
arena and a CUDA graph captured over it is checkpointed (its device memory
given back, measured through NVML) and restored, by a supervisor holding its
pid and by itself; afterwards its pointers are the same and the same graph
executable replays byte for byte (sentinel-checked), with no recapture.  A
lean checkpoint (issue 38) puts the arena to sleep first (``prepare(sleep=
...)``, two buffers kept) and wakes it after (``finish``): the kept buffers
keep their sentinels, the discarded ones of the zero_all set read zero, and
the graph replays byte for byte too.

Everything runs in child processes under watchdogs (helpers.run_watched; the
engine under a deadline on each reply), so a restore that fails, or hangs,
fails the test instead of the run.  The engine is a process running this
module's `engine_main`; bench/bench_checkpoint.py drives the same engine."""

import faulthandler
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from helpers import run_watched

pytestmark = pytest.mark.gpu

HERE = os.path.dirname(os.path.abspath(__file__))
LIMITS = (1024, 4096, 16, 32)
SRC = "moe_router_in_f32"           # touched by neither zero_all nor the graph's writes
KEPT = "gdn_fla_scratch"            # a sentinel nothing writes (discarded by a lean checkpoint)
TINY = "token_ids"                  # a small sentinel nothing writes (kept by a lean checkpoint)
WRITTEN = ("hidden_states", "residual", "logits")
# What a lean checkpoint keeps: SRC (the graph copies it) and TINY; every
# other buffer is discarded.
LEAN = {"keep": [SRC, TINY]}
REPLY_TIMEOUT = 120.0


# -- the engine (a process of its own) -------------------------------------------------


def _ok(res):
    from cuda.bindings import driver as cu
    err = res[0] if isinstance(res, tuple) else res
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"driver call failed: {err}")
    return res[1] if isinstance(res, tuple) and len(res) == 2 else None


class Engine:
    """A reserved arena, a graph captured over it (zero_all on the arena's
    kernel, a copy SRC -> hidden_states, a memset of residual), and the
    sentinel checks."""

    def __init__(self, limits, preset="qwen3-next-80b", extra_bytes=0):
        import numpy as np
        from cuda.bindings import driver as cu
        import metrale
        from metrale import BufferArena, ModelConfig
        self.np, self.cu = np, cu
        self.gpu = metrale.CudaBackend(0)
        t0 = time.perf_counter()
        self.arena = BufferArena.new(ModelConfig.preset(preset), *limits, self.gpu,
                                     reserve=tuple(limits))
        self.build_s = time.perf_counter() - t0
        self.extra = int(_ok(cu.cuMemAlloc(extra_bytes))) if extra_bytes else None   # "weights"
        self.extra_bytes = extra_bytes
        if self.extra is not None:
            _ok(cu.cuMemsetD8(self.extra, 0x77, extra_bytes))
        self.sizes = self.arena.sizes()
        self.ptrs = dict(self.arena.ptrs)
        self.n = min(self.sizes.hidden_states, getattr(self.sizes, SRC))
        self.stream = _ok(cu.cuStreamCreate(1))            # CU_STREAM_NON_BLOCKING
        t0 = time.perf_counter()
        self.exec = self.capture()
        self.capture_s = time.perf_counter() - t0
        self.zero_all = self.arena.summary().groups["zero_all"]
        self.prepared, self.kept = None, None      # the last prepare's record, what it kept

    def capture(self):
        cu, s = self.cu, self.stream
        _ok(cu.cuStreamBeginCapture(s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        self.arena.zero_all(stream=int(s))
        _ok(cu.cuMemcpyDtoDAsync(self.ptrs["hidden_states"], self.ptrs[SRC], self.n, s))
        _ok(cu.cuMemsetD8Async(self.ptrs["residual"], 0x5A, self.sizes.residual, s))
        graph = _ok(cu.cuStreamEndCapture(s))
        return _ok(cu.cuGraphInstantiate(graph, 0))

    def pattern(self, k):
        return self.np.random.default_rng(k).integers(0, 256, getattr(self.sizes, SRC),
                                                      dtype=self.np.uint8)

    def put(self, name, data):
        self.gpu.upload(self.ptrs[name], data.tobytes())

    def get(self, name):
        return self.np.frombuffer(self.gpu.download(self.ptrs[name], getattr(self.sizes, name)),
                                  dtype=self.np.uint8)

    def arm(self, k):
        """Sentinels for round k: SRC a pattern, KEPT and the graph's targets a byte."""
        np = self.np
        self.put(SRC, self.pattern(k))
        self.put(KEPT, np.full(getattr(self.sizes, KEPT), (0xC0 + k) % 256, np.uint8))
        self.put(TINY, np.full(getattr(self.sizes, TINY), (0x30 + k) % 256, np.uint8))
        for name in WRITTEN:
            self.put(name, np.full(getattr(self.sizes, name), 0xAB, np.uint8))
        _ok(self.cu.cuCtxSynchronize())
        return {"committed": self.arena.committed_bytes()}

    def edges(self, name, n=1 << 20):
        """The first and last `n` bytes of a buffer (a whole one's check
        would read gigabytes per round)."""
        size = getattr(self.sizes, name)
        if size <= 2 * n:
            return self.get(name)
        head = self.gpu.download(self.ptrs[name], n)
        tail = self.gpu.download(self.ptrs[name] + size - n, n)
        return self.np.frombuffer(head + tail, dtype=self.np.uint8)

    def verify(self, k):
        """Pointers unchanged, the sentinels kept, then one replay of the graph
        captured at the start, checked byte for byte.  After a lean
        checkpoint (the arena slept and woke), what it kept has its
        sentinels, the discarded buffers of the zero_all set read zero
        (WRITTEN whole, the others at both ends) and KEPT is not read (its
        contents are undefined)."""
        np, cu = self.np, self.cu
        bad, kept, self.kept = [], self.kept, None
        if dict(self.arena.ptrs) != self.ptrs:
            bad.append("pointers moved")
        src = self.pattern(k)
        if not (self.get(SRC) == src).all():
            bad.append(f"{SRC} changed")
        if not (self.get(TINY) == (0x30 + k) % 256).all():
            bad.append(f"{TINY} changed")
        if kept is None:
            if not (self.get(KEPT) == (0xC0 + k) % 256).all():
                bad.append(f"{KEPT} changed")
            for name in WRITTEN:
                if not (self.get(name) == 0xAB).all():
                    bad.append(f"{name} changed before the replay")
        else:
            for name in self.zero_all:
                if name not in kept and (self.get(name) if name in WRITTEN
                                         else self.edges(name)).any():
                    bad.append(f"{name} not zero after the wake")
        if self.extra is not None:
            tail = np.empty(1 << 20, np.uint8)
            _ok(cu.cuMemcpyDtoH(tail.ctypes.data, self.extra + self.extra_bytes - tail.size,
                                tail.size))
            if not (tail == 0x77).all():
                bad.append("the extra allocation changed")
        t0 = time.perf_counter()
        _ok(cu.cuGraphLaunch(self.exec, self.stream))
        _ok(cu.cuStreamSynchronize(self.stream))
        replay_s = time.perf_counter() - t0
        hs = self.get("hidden_states")
        if not ((hs[:self.n] == src[:self.n]).all() and not hs[self.n:].any()):
            bad.append("hidden_states after the replay")
        if not (self.get("residual") == 0x5A).all():
            bad.append("residual after the replay")
        if self.get("logits").any():
            bad.append("logits after the replay (zero_all)")
        return {"ok": not bad, "bad": bad, "replay_s": replay_s}

    def prepare(self, sleep):
        """metrale.checkpoint.prepare, as an engine calls it before a
        checkpoint (`sleep`: False, or LEAN); its record's figures."""
        import metrale.checkpoint as ckpt
        t0 = time.perf_counter()
        p = ckpt.prepare(sleep=sleep or False)
        took = time.perf_counter() - t0
        self.prepared = p
        asleep = any(a is self.arena for a in p.arenas)
        self.kept = (tuple(sleep.get("keep", ())) if isinstance(sleep, dict) else ()) \
            if asleep else None
        return {"prepare_s": took, "prepared": {
            "arenas": len(p.arenas), "committed_bytes": p.committed_bytes,
            "resident_bytes": p.resident_bytes, "kept_bytes": p.kept_bytes,
            "offloaded_bytes": p.offloaded_bytes, "released_bytes": p.released_bytes,
            "discarded_bytes": p.discarded_bytes, "line": str(p)}}

    def finish(self, suspended=None):
        """metrale.checkpoint.finish after the restore (the arena wakes if it
        slept); with `suspended` (the supervisor's suspend figures) the log
        line of the record and the image."""
        import metrale.checkpoint as ckpt
        t0 = time.perf_counter()
        ckpt.finish()
        out = {"finish_s": time.perf_counter() - t0}
        if suspended is not None:
            out["line"] = self.prepared.log_line(suspended)
        return out

    def self_suspend(self, timeout, probe_nvml=False):
        """This process checkpoints itself (suspend of its own pid, from this
        thread; `prepare` came before) and replies while checkpointed: the
        supervisor reads the GPU's memory meanwhile.  `probe_nvml`: whether
        NVML answers in the checkpointed process, asked on a thread of its
        own (bounded)."""
        import metrale.checkpoint as ckpt
        out = {"suspend": ckpt.suspend(os.getpid(), timeout=timeout)}
        out["state"] = ckpt.state(os.getpid())
        out["line"] = self.prepared.log_line(out["suspend"])    # CPU work only: allowed here
        if not probe_nvml:
            return out
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("used", gpu_used_bytes()), daemon=True)
        t.start()
        t.join(3.0)
        out["nvml_while_checkpointed"] = "answered" if "used" in box else "blocked for 3 s"
        return out

    def self_resume(self, k, timeout):
        """The same process restores itself, finishes, and checks."""
        import metrale.checkpoint as ckpt
        out = {"resume": ckpt.resume(os.getpid(), timeout=timeout)}
        out["state_after"] = ckpt.state(os.getpid())
        out.update(self.finish())
        out.update(self.verify(k))
        return out


def engine_main():
    """The engine process: JSON commands on stdin, one JSON reply each on stdout."""
    opts = json.loads(sys.argv[1])
    out = sys.stdout
    sys.stdout = sys.stderr             # stray prints stay off the protocol
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # the supervisor asks on a hang
    eng = Engine(opts["limits"], opts.get("preset", "qwen3-next-80b"), opts.get("extra_bytes", 0))

    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    reply({"ready": os.getpid(), "build_s": eng.build_s, "capture_s": eng.capture_s,
           "committed": eng.arena.committed_bytes(), "slab": eng.arena.slab_bytes(),
           "sizes": {n: b.nbytes for n, b in eng.arena.buffers.items()},
           "granularity": eng.gpu.allocation_granularity(),
           "first": eng.arm(0) and eng.verify(0)})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "arm":
                reply(eng.arm(cmd["k"]))
            elif cmd["cmd"] == "verify":
                reply(eng.verify(cmd["k"]))
            elif cmd["cmd"] == "prepare":
                reply(eng.prepare(cmd.get("sleep", False)))
            elif cmd["cmd"] == "finish":
                reply(eng.finish(cmd.get("suspended")))
            elif cmd["cmd"] == "self_suspend":
                reply(eng.self_suspend(cmd.get("timeout", 120.0), cmd.get("probe_nvml", False)))
            elif cmd["cmd"] == "self_resume":
                reply(eng.self_resume(cmd["k"], cmd.get("timeout", 120.0)))
            elif cmd["cmd"] == "busy":          # queue GPU work, do not wait for it
                cu = eng.cu
                for _ in range(cmd["n"]):
                    _ok(cu.cuMemsetD8Async(eng.extra or eng.ptrs[KEPT], 1,
                                           eng.extra_bytes or getattr(eng.sizes, KEPT), eng.stream))
                reply({"queued": cmd["n"]})
            elif cmd["cmd"] == "sync":
                t0 = time.perf_counter()
                _ok(eng.cu.cuStreamSynchronize(eng.stream))
                reply({"sync_s": time.perf_counter() - t0})
            elif cmd["cmd"] == "capture":
                t0 = time.perf_counter()
                eng.capture()
                reply({"capture_s": time.perf_counter() - t0})
            elif cmd["cmd"] == "quit":
                reply({"bye": True})
                return
        except Exception as e:          # the supervisor reads it
            reply({"error": f"{type(e).__name__}: {e}"})


class EngineProcess:
    """The supervisor's handle on an engine: send a command, wait for its reply
    under a deadline (a reply that does not come fails, it never hangs)."""

    def __init__(self, limits=LIMITS, **opts):
        self.log = tempfile.TemporaryFile("w+")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        code = "import test_checkpoint_cuda as t; t.engine_main()"
        self.proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(dict(limits=limits,
                                     **opts))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env)
        self.pid = self.proc.pid
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.ready = self.recv()

    def stderr(self):
        self.log.seek(0)
        return self.log.read()[-4000:]

    def recv(self, timeout=REPLY_TIMEOUT):
        if not self.sel.select(timeout):
            self.proc.send_signal(signal.SIGUSR1)      # its threads' stacks, into the log
            time.sleep(1.0)
            raise AssertionError(f"the engine gave no reply within {timeout} s\n{self.stderr()}")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the engine exited ({self.proc.poll()})\n{self.stderr()}")
        obj = json.loads(line)
        if "error" in obj:
            raise AssertionError(f"the engine failed: {obj['error']}\n{self.stderr()}")
        return obj

    def ask(self, wait=REPLY_TIMEOUT, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.recv(wait)

    def close(self):
        try:
            if self.proc.poll() is None:
                self.ask(wait=30, cmd="quit")
                self.proc.wait(30)
        except Exception:
            pass
        finally:
            if self.proc.poll() is None:        # stuck (checkpointed for good, say)
                self.proc.kill()
                self.proc.wait(30)
            self.log.close()


# -- NVML, through ctypes: the GPU's used memory and UUID, with no CUDA context ----


def _nvml():
    import ctypes
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    if lib.nvmlInit_v2() != 0:
        raise RuntimeError("nvmlInit_v2 failed")
    dev = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) != 0:
        raise RuntimeError("nvmlDeviceGetHandleByIndex_v2 failed")
    return ctypes, lib, dev


def gpu_used_bytes():
    """Device memory in use on GPU 0, all processes (nvmlDeviceGetMemoryInfo)."""
    ctypes, lib, dev = _nvml()

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]
    m = Memory()
    if lib.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(m)) != 0:
        raise RuntimeError("nvmlDeviceGetMemoryInfo failed")
    return m.used


def gpu_uuid():
    """GPU 0's UUID as nvidia-smi -L prints it ('GPU-...')."""
    ctypes, lib, dev = _nvml()
    buf = ctypes.create_string_buffer(96)
    if lib.nvmlDeviceGetUUID(dev, buf, 96) != 0:
        raise RuntimeError("nvmlDeviceGetUUID failed")
    return buf.value.decode()


# -- the tests (each in a watched child: the supervisor) -------------------------------


def _supervised(rounds):
    import metrale.checkpoint as ckpt
    from metrale import MetraleError
    eng = EngineProcess()
    try:
        pid, out = eng.pid, {"ready": eng.ready, "rounds": []}
        assert eng.ready["first"]["ok"], eng.ready["first"]
        assert ckpt.state(pid) == "running"
        try:                    # a running process cannot be restored: the error names its state
            ckpt.restore(pid)
            out["restore_running"] = "accepted"
        except MetraleError as e:
            out["restore_running"] = str(e)
        for k in range(1, rounds + 1):
            r = {"armed": eng.ask(cmd="arm", k=k), "used_before": gpu_used_bytes()}
            r["suspend"] = ckpt.suspend(pid, timeout=120)
            r["state"] = ckpt.state(pid)
            r["used_checkpointed"] = gpu_used_bytes()
            r["resume"] = ckpt.resume(pid, timeout=120)
            r["state_after"] = ckpt.state(pid)
            r["used_after"] = gpu_used_bytes()
            r.update(eng.ask(cmd="verify", k=k))
            out["rounds"].append(r)
        return out
    finally:
        eng.close()


def supervised_round(eng, k, timeout=120.0, sleep=False):
    """One round of a supervisor checkpointing an engine: the engine
    prepares (`sleep`: prepare's), the supervisor suspends and resumes its
    pid, the engine finishes (logging its record with the supervisor's
    figures) and checks; the GPU's memory read here between the steps."""
    import metrale.checkpoint as ckpt
    r = {"armed": eng.ask(cmd="arm", k=k), "used_before": gpu_used_bytes()}
    r.update(eng.ask(cmd="prepare", sleep=sleep))
    r["used_prepared"] = gpu_used_bytes()
    r["suspend"] = ckpt.suspend(eng.pid, timeout=timeout)
    r["state"] = ckpt.state(eng.pid)
    r["used_checkpointed"] = gpu_used_bytes()
    r["resume"] = ckpt.resume(eng.pid, timeout=timeout)
    r["state_after"] = ckpt.state(eng.pid)
    r.update(eng.ask(cmd="finish", suspended=r["suspend"]))
    r["used_after"] = gpu_used_bytes()
    r.update(eng.ask(cmd="verify", k=k))
    return r


def _check_round(r, committed):
    assert r["ok"], r["bad"]
    assert (r["state"], r["state_after"]) == ("checkpointed", "running")
    # the arena's device memory (and the context's) given back while checkpointed
    assert r["used_before"] - r["used_checkpointed"] >= committed, r
    assert r["used_after"] - r["used_checkpointed"] >= committed, r


def test_a_supervisor_checkpoints_and_restores_an_engine():
    out = run_watched(_supervised, 3, timeout=120)
    print(json.dumps(out, indent=1))        # the timings, in the log with -s
    assert out["restore_running"].startswith("restore of pid ")
    assert out["restore_running"].endswith("the process is in state running")
    for r in out["rounds"]:
        _check_round(r, out["ready"]["committed"])


def self_round(eng, k, timeout=30.0, probe_nvml=False, sleep=False):
    """One round of an engine checkpointing itself (prepare, suspend of its
    own pid; resume, finish, verify), the GPU's memory read here between
    the steps.  `sleep`: prepare's (LEAN: a lean checkpoint)."""
    r = {"armed": eng.ask(cmd="arm", k=k), "used_before": gpu_used_bytes()}
    r.update(eng.ask(cmd="prepare", sleep=sleep))
    r["used_prepared"] = gpu_used_bytes()
    r.update(eng.ask(wait=timeout + 15, cmd="self_suspend", timeout=timeout,
                     probe_nvml=probe_nvml))
    r["used_checkpointed"] = gpu_used_bytes()
    r.update(eng.ask(wait=timeout + 15, cmd="self_resume", k=k, timeout=timeout))
    r["used_after"] = gpu_used_bytes()
    return r


def _self_checkpointed(rounds):
    eng = EngineProcess()
    try:
        return {"ready": eng.ready, "rounds": [self_round(eng, k) for k in range(1, rounds + 1)]}
    finally:
        eng.close()


def test_an_engine_checkpoints_and_restores_itself():
    out = run_watched(_self_checkpointed, 2, timeout=120)
    print(json.dumps(out, indent=1))
    for r in out["rounds"]:
        _check_round(r, out["ready"]["committed"])


def _lean(form, rounds):
    eng = EngineProcess()
    try:
        step = self_round if form == "self" else supervised_round
        return {"ready": eng.ready,
                "rounds": [step(eng, k, sleep=LEAN) for k in range(1, rounds + 1)]}
    finally:
        eng.close()


@pytest.mark.parametrize("form", ["self", "supervisor"])
def test_a_lean_checkpoint_keeps_what_it_is_told_and_the_graph_replays(form):
    out = run_watched(_lean, form, 1, timeout=120)
    print(json.dumps(out, indent=1))
    ready = out["ready"]
    g, sizes = ready["granularity"], ready["sizes"]
    # a reserved arena maps each buffer's size rounded up to the granularity,
    # but token_ids and scratch: scratch follows token_ids at the next 256
    # bytes and the two share their granules (docs/step-inputs.md)
    pair = -(-sizes["token_ids"] // 256) * 256 + sizes["scratch"]
    committed = -(-pair // g) * g + sum(-(-n // g) * g for name, n in sizes.items()
                                        if name not in ("token_ids", "scratch"))
    kept = sizes[SRC] + sizes[TINY]
    for r in out["rounds"]:
        _check_round(r, committed)          # the replay byte for byte, the sentinels
        p = r["prepared"]
        assert (p["arenas"], p["committed_bytes"], p["resident_bytes"]) == (1, committed, 0)
        assert (p["kept_bytes"], p["offloaded_bytes"]) == (kept, 0)
        assert p["discarded_bytes"] == committed - kept
        # given back by prepare, before the lock (NVML reads the whole GPU: 1 % leeway)
        assert r["used_before"] - r["used_prepared"] >= 0.99 * committed, r
        assert r["suspend"]["rss_before"] > 0 and r["resume"]["rss_after"] > 0
        assert r["line"].startswith("prepare: 1 arena(s) detached or asleep; of ")
        assert "of host memory (resident " in r["line"]


def _refused_then_restored():
    import metrale.checkpoint as ckpt
    from metrale import MetraleError
    eng = EngineProcess()
    try:
        pid, out = eng.pid, {}
        eng.ask(cmd="arm", k=5)
        ckpt.suspend(pid, timeout=120)
        bogus = "GPU-" + "0f" * 16              # no such GPU
        try:
            ckpt.resume(pid, gpu_map={bogus: bogus}, timeout=60)
            out["bogus"] = "accepted"
        except MetraleError as e:
            out["bogus"] = str(e)
        out["state"] = ckpt.state(pid)
        uuid = gpu_uuid()
        ckpt.resume(pid, gpu_map={uuid: uuid}, timeout=120)    # the same GPU, named
        out["state_after"] = ckpt.state(pid)
        out.update(eng.ask(cmd="verify", k=5))
        return out
    finally:
        eng.close()


def test_a_refused_restore_names_the_state_and_a_later_one_works():
    out = run_watched(_refused_then_restored, timeout=120)
    print(json.dumps(out, indent=1))
    assert out["bogus"].startswith("restore of pid ") and " failed: CUDA_ERROR_" in out["bogus"]
    assert out["bogus"].endswith("the process is in state checkpointed (gpu_map of 1 GPUs)")
    assert out["state"] == "checkpointed" and out["state_after"] == "running"
    assert out["ok"], out["bad"]

