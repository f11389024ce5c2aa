"""GPU check: vLLM 0.33.0's own call sites drive every Triton kernel they reach, loader vs JIT, bit for bit.

Run on an sm_90 machine with no vLLM, from the repository root, with .device prepared by
tools/prepare_device.py (vLLM's call-site modules carried verbatim in .device/vllm_src):

    python tests/gpu/checks/check_call_sites.py --bundle B.nojit [--vllm-src .device/vllm_src]
        [--observed OUT.jsonl] [--json OUT.json]
    TRITON_INTERPRET=1 python tests/gpu/checks/check_call_sites.py --interpret   # CPU: JIT role only
    python tests/gpu/checks/check_call_sites.py --dry-keys --plan PLAN [--steps-module M]  # CPU: keys vs plan

--steps-module names the module of steps (default call_site_steps, DeepSeek-V4; qwen_call_site_steps: Qwen3.5 with
NOJIT_QWEN_FACTS from tools/prepare_qwen_device.py). --dry-keys launches nothing: the steps run on CPU tensors with
Triton's launches recorded and each call keyed as the JIT keys it, against the plan (the box's pre-check).

The steps (call_site_steps.py) call vLLM's wrapper functions and kernel owners the way the DeepSeek-V4
model, its attention backends, the V2 runner, the sampler and the speculative decoder do: a prefill
step, a decode step, a mixed step, an MTP draft-and-verify step, sampling with every option on.
Two fresh processes run the same steps on the same seeded inputs:
  jit:    Triton's JIT (no nojit);
  loader: nojit installed in strict mode from the bundle, CUDA_DISABLE_PTX_JIT=1, an empty Triton
          cache, an audit hook counting processes, Triton's jit_post_compile_hook counting compiles.
Every launch goes through a tracer wrapped around the kernel's `run`. Before the launch it snapshots
every tensor argument (the pre-state: the data the step put there, known and hashed) and poisons
the tensors the kernel only stores to (every byte 0x5A: 1.5e16 as a float, 0x5A5A5A5A as an int,
values no kernel here writes); after it, it counts the elements written (changed from the poison,
for store-only tensors; changed from the pre-state, for tensors the kernel also reads or that it
writes in place), puts the pre-state back into store-only elements the launch left poisoned (a
kernel that stores sparsely into a live buffer, as bad words into the logits, must leave the rest
as vLLM would) and hashes every output. A launch is identical to the JIT's when its outputs, its
written counts and its inputs' pre-state hashes all match. In the loader run it also keys the call exactly as the loader does and says how it is
served (exact / generic / miss); these observed keys are written as JSONL (the format of
NOJIT_MODE=record, readable by `nojit build --add-keys` and `nojit coverage --observed`).
Launches are compared by (step, kernel, n-th launch of that kernel in the step), and output tables of
device addresses (uint64) are not hashed (addresses differ between processes; their targets are).
A launch whose key the bundle lacks is not launched in the loader run (strict mode would abort the
step): it is recorded as missing and what the JIT's launch wrote is copied in, so the rest of the
step still runs and is compared.
A kernel fails if a key's launches wrote nothing (vacuous: for in-place kernels, nothing changed from
the pre-state, which means the step's inputs are wrong), if any launch differs from the JIT,
on any compile or process in the loader run, or if a step reached a key the bundle lacks.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

VERBOSE = os.environ.get("NOJIT_CALL_SITES_VERBOSE") == "1"  # each launch named on stderr before it runs
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)


STORES = ("store", "atomic_add", "atomic_max", "atomic_min", "atomic_xchg", "atomic_cas", "atomic_or",
          "atomic_and", "atomic_xor")


def _param_names(fn: Any) -> list[str]:
    return [p.name for p in fn.params] if hasattr(fn, "params") else list(fn.arg_names)


def _reached(fn: Any, calls: tuple[str, ...], depth: int = 0) -> set[str]:
    """Parameters reaching the base address of `calls` (tl.store, tl.load, atomics): directly, through local
    names assigned from them (`row_ptr = out_ptr + i * stride`, any depth) and through @jit helpers (JIT or
    interpreted) they are passed to, positionally or by keyword."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    params = _param_names(fn)
    alias: dict[str, str] = {p: p for p in params}

    def root(node: ast.AST) -> str | None:
        while isinstance(node, ast.BinOp):
            node = node.left if root(node.left) else node.right
        return alias.get(node.id) if isinstance(node, ast.Name) else None

    for _ in range(3):  # aliases of aliases
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                r = root(node.value)
                if r is not None and node.targets[0].id not in params:
                    alias[node.targets[0].id] = r
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr in calls and node.args:
            if (r := root(node.args[0])) is not None:
                out.add(r)
        elif isinstance(node.func, ast.Name) and depth < 4:
            helper = fn.fn.__globals__.get(node.func.id)
            if helper is None or not hasattr(helper, "fn") or not (hasattr(helper, "params")
                                                                   or hasattr(helper, "arg_names")):
                continue
            used = _reached(helper, calls, depth + 1)
            names = _param_names(helper)
            passed = [*zip(names, node.args), *((kw.arg, kw.value) for kw in node.keywords)]
            out |= {r for name, arg in passed if name in used and (r := root(arg)) is not None}
    return out


class LaunchTracer:
    """Wraps a kernel's `run`: poison outputs, launch, count written elements, hash outputs, key the call."""

    def __init__(self, role: str, device: str) -> None:
        self.role = role
        self.device = device
        self.step = ""
        self.launches: list[dict] = []
        self.servers: dict[str, Any] = {}  # kernel id -> nojit server (loader role)
        self._params: dict[int, tuple[set[str], set[str]]] = {}
        self._binders: dict[int, Any] = {}
        self.indirect: dict[str, list[Any]] = {}  # kernel qualname -> tensors it writes through addresses
        self._ordinal: collections.Counter = collections.Counter()  # (step, kernel) -> launches so far
        # (step, kernel, ordinal) -> {argument: what the JIT left in it}: the JIT run records what every launch
        # wrote; the loader run copies it in for a launch whose key the bundle misses, so one missing key is
        # recorded and the rest of the step still runs on the JIT's data and is still compared.
        self.replay: dict[tuple[str, str, int], dict[str, Any]] = {}

    def _io(self, fn: Any) -> tuple[set[str], set[str]]:
        """(store-only parameters, read-and-written parameters) of the kernel: triton_harness's analysis plus
        _reached's (local aliases, helpers of interpreted kernels too). A parameter read anywhere is never poisoned
        (poison read back would change what the kernel computes)."""
        from triton_harness import _stored_params

        got = self._params.get(id(fn))
        if got is None:
            names = _param_names(fn)
            stored = _reached(fn, STORES)
            # Atomics read what they update: their targets are never poisoned.
            reads = ("load", *STORES[1:])
            loaded = _reached(fn, reads)
            if hasattr(fn, "params"):
                stored |= {names[i] for i in _stored_params(fn)}
                loaded |= {names[i] for i in _stored_params(fn, calls=reads)}
            got = (stored - loaded, stored & loaded)
            self._params[id(fn)] = got
        return got

    def wrap(self, fn: Any, run: Any) -> Any:
        """A `run` replacement for fn that traces each launch and calls `run` (JIT or nojit server)."""
        kid = f"{fn.fn.__module__}:{fn.fn.__qualname__}"

        def traced(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            if warmup:
                return run(*args, grid=grid, warmup=warmup, **kwargs)
            return self.launch(fn, kid, run, args, grid, kwargs)

        return traced

    def launch(self, fn: Any, kid: str, run: Any, args: tuple, grid: Any, kwargs: dict) -> Any:
        import torch

        names = [p.name for p in fn.params] if hasattr(fn, "params") else list(fn.arg_names)
        bound = {**dict(zip(names, args)), **kwargs}
        store_only, rmw = self._io(fn)
        # uint64 tensors are tables of device addresses (vLLM's pointer tables): never poisoned.
        outs = {n: t for n, t in bound.items()
                if n in store_only and isinstance(t, torch.Tensor) and t.dtype != torch.uint64}
        # An output that shares memory with another argument (vLLM's gated RMSNorm writes `out` over `x`) is an
        # input too: poisoning it would poison what the kernel reads. Compared against its pre-state instead.
        storage = {n: t.untyped_storage().data_ptr() for n, t in bound.items() if isinstance(t, torch.Tensor)}
        outs = {n: t for n, t in outs.items() if list(storage.values()).count(storage[n]) == 1}
        # Every other tensor argument may be written too (stores the analysis cannot see), and so may
        # the tensors a step registered as written through a table of addresses: compared to a snapshot.
        inouts = {n: t for n, t in bound.items() if n not in outs and isinstance(t, torch.Tensor)}
        for i, t in enumerate(self.indirect.get(kid.rpartition(":")[2], ())):
            inouts[f"indirect[{i}]"] = t
        at = (self.step, kid, self._ordinal[(self.step, kid)])
        self._ordinal[(self.step, kid)] += 1
        row: dict[str, Any] = {"step": self.step, "kernel": kid, "index": len(self.launches)}
        if self.role == "loader":
            row.update(self._serving(kid, args, kwargs))
            if row["outcome"] == "miss":
                return self._stand_in(row, at, outs, inouts)
        else:  # key the call as Triton would: listed against the plan, and named where the loader never got there
            row.update(self._interpreted_key(fn, args, kwargs))
        before = {n: _bits(t).clone() for n, t in {**outs, **inouts}.items()}
        # The inputs' pre-state (store-only outputs excluded: what a fresh allocation holds is not an input)
        row["pre"] = {n: _digest(before[n]) for n, t in inouts.items() if t.dtype != torch.uint64}
        for t in outs.values():
            _bits(t).fill_(_poison_of(t))
        if VERBOSE:
            print(f"launch {self.step} {kid} grid={grid if not callable(grid) else 'fn'}", file=sys.stderr, flush=True)
        try:
            result = run(*args, grid=grid, warmup=False, **kwargs)
        except Exception as exc:  # listed with its key (the interpreter cannot run some kernels), then raised
            row.update(written={}, hashes=None, error=f"{type(exc).__name__}: {exc}"[:300])
            self.launches.append(row)
            raise
        if self.device == "cuda":
            torch.cuda.synchronize()
        untouched = {n: _bits(t) == _poison_of(t) for n, t in outs.items()}
        written = {n: int(t.numel() - untouched[n].sum()) for n, t in outs.items()}
        written.update({n: int((_bits(t) != before[n]).sum()) for n, t in inouts.items()})
        row["written"] = written
        row["in_place"] = sorted(n for n in inouts if written[n])  # updated where it was read: pre-state compared
        # Hashed as the launch left them (store-only outputs: poison where it did not store). uint64 tables hold
        # device addresses, which differ between the two processes: their targets are compared instead (the step
        # registers them as indirect tensors).
        row["hashes"] = {n: _digest(t) for n, t in {**outs, **inouts}.items() if t.dtype != torch.uint64}
        for n, t in outs.items():  # what the launch did not store: the pre-state again, as the step had it
            _bits(t)[untouched[n]] = before[n][untouched[n]]
        self.launches.append(row)
        if self.role == "jit":
            self.replay[at] = {n: t.detach().cpu().clone() for n, t in {**outs, **inouts}.items() if written[n]}
        return result

    def _stand_in(self, row: dict, at: tuple[str, str, int], outs: dict[str, Any], inouts: dict[str, Any]) -> None:
        """A launch the bundle cannot serve: not launched (strict mode would raise and abort the step); recorded
        as missing, and what the JIT's launch wrote copied in so the step's later launches still compare."""
        saved = self.replay.get(at)
        row.update(written={}, hashes=None, replayed=saved is not None)
        tensors = {**outs, **inouts}  # as the JIT run left them: the pre-state, and what its launch wrote
        for n, t in (saved or {}).items():
            if n in tensors and tensors[n].shape == t.shape and tensors[n].dtype == t.dtype:
                tensors[n].copy_(t.to(tensors[n].device))
        self.launches.append(row)
        print(f"missing key, JIT writes copied in: {at[0]} {at[1]} #{at[2]} {row.get('why', '')}", file=sys.stderr,
              flush=True)
        return None

    def _interpreted_key(self, fn: Any, args: tuple, kwargs: dict) -> dict:
        """Triton's key for this call (nojit's binder over a JITFunction of the same Python function)."""
        import torch
        from triton._utils import canonicalize_ptr_dtype
        from triton.runtime.jit import JITFunction

        from nojit.loader.bundle.triton_key import ArgSpecializer, key_to_json, make_binder, options_key

        binder = self._binders.get(id(fn))
        if binder is None:
            # The kernel's own do_not_specialize lists (InterpretedFunction keeps them in kwargs): without them
            # those arguments would be keyed as specialized, unlike the loader's and the plan's keys.
            opts = fn.kwargs if hasattr(fn, "kwargs") else {
                "do_not_specialize": fn.do_not_specialize,
                "do_not_specialize_on_alignment": fn.do_not_specialize_on_alignment}
            jit = JITFunction(fn.fn, **{k: opts[k] for k in ("do_not_specialize", "do_not_specialize_on_alignment")
                                        if opts.get(k) is not None})
            binder = self._binders[id(fn)] = make_binder(jit, ArgSpecializer(canonicalize_ptr_dtype, torch.Tensor))
        try:
            _bound, spec, options = binder(*args, **kwargs)
        except Exception as exc:
            return {"key": None, "outcome": "unkeyed", "why": str(exc)[:200]}
        full = {**options, "debug": False, "instrumentation_mode": ""}
        return {"key": key_to_json((spec, options_key(full))), "outcome": "interpreted"}

    def _serving(self, kid: str, args: tuple, kwargs: dict) -> dict:
        """The key of this call as nojit's server computes it, and how the bundle serves it."""
        from nojit.loader.bundle.triton_key import key_to_json

        server = self.servers.get(kid)
        if server is None:
            return {"key": None, "outcome": "miss", "why": "kernel not in the bundle"}
        try:
            _bound, spec, options = server._binder(*args, **kwargs)
            key = (spec, server.options_key(options))
        except Exception as exc:  # an argument nojit cannot key: the server would miss too
            return {"key": None, "outcome": "miss", "why": f"unkeyable: {exc}"}
        outcome = ("exact" if key in server.exact else "generic" if server.fallback_for(key) is not None
                   else "miss")
        return {"key": key_to_json(key), "outcome": outcome, "source_hash": server.record.source_hash}


POISON = 0x5A  # every byte of a store-only output before its launch


def _poison_of(t: Any) -> int:
    """The poison as an element of _bits(t): 0x5A in every byte (a signed integer of the element's width)."""
    width = t.element_size()
    value = int.from_bytes(bytes([POISON]) * width, "little")
    return value - (1 << (8 * width)) if value >= 1 << (8 * width - 1) else value


def _bits(t: Any) -> Any:
    """The tensor's bits as signed integers of the same width (a view: writing it writes the tensor)."""
    import torch

    width = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(width) if t.dtype != width else t


def _digest(t: Any) -> str:
    return hashlib.sha256(_bits(t).detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:24]


# Python's process starts, as check_flashinfer_launch.PROCESS_EVENTS (os.fork too: multiprocessing's fork, os.spawn*)
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn", "os.fork",
                            "os.forkpty", "pty.spawn"})


def process_hook(events: list[str]) -> Any:
    """An audit hook appending each process start to events (os.fork's event has no arguments), with the innermost
    frames outside the standard library that started it (what started it is the first question a FAIL asks)."""
    def hook(event: str, args: tuple) -> None:
        if event in PROCESS_EVENTS:
            frames = [f"{os.path.basename(f.filename)}:{f.lineno}" for f in traceback.extract_stack()[:-1]
                      if "/subprocess.py" not in f.filename and "/ctypes/util.py" not in f.filename][-8:]
            events.append(f"{event}:{str(args[0])[:60] if args else ''} <- {' < '.join(reversed(frames))}")
    return hook


def before_plugins(events: list[str]) -> list[str]:
    """The processes started so far (by `import torch` and `import triton`, which a server pays before any plugin
    loads), taken out of events, which then counts from here. Taken out only while no nojit module is imported: a
    process nojit's code starts always counts."""
    if any(name == "nojit" or name.startswith("nojit.") for name in sys.modules):
        return []
    taken = list(events)
    del events[:]
    return taken


def child(args: argparse.Namespace) -> None:
    events: list[str] = []
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if interpret else "cuda"
    if args.child == "loader":
        os.environ["CUDA_DISABLE_PTX_JIT"] = "1"
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="nojit-empty-triton-cache-")
        sys.addaudithook(process_hook(events))
    import torch
    import triton

    if not interpret and torch.cuda.is_available():
        # what a server has done before it serves: CUDA up, and cuda.pathfinder imported (its import runs
        # ctypes.util.find_library: ldconfig, then gcc and file where ldconfig lacks libdl; the Qwen3.5 steps reach
        # it after the window opened on the H200), as check_gdn_flashinfer's _before_counting does
        torch.cuda.init()
        try:
            import cuda.pathfinder  # noqa: F401
        except ImportError:
            pass

    # `import torch` itself starts processes on some machines (torch.cuda imports cuda.pathfinder, whose
    # ctypes.util.find_library("dl") runs ldconfig, then gcc and file where ldconfig does not list libdl: seen on the
    # H200): a server pays that (and `import triton`) before any plugin loads, so the count that must be 0 starts
    # here; those are reported apart (before_plugins: none taken out once a nojit module is imported)
    import_events = before_plugins(events)
    if args.child == "loader":
        # In a server the plugin installs nojit before vLLM imports the model's modules, and the Triton room answers
        # Triton's driver then (loader/runtimes/triton/face.py). FLA's ops/utils.py asks the driver at import
        # (_check_platform -> driver.active.get_current_target()): asked first, Triton's real driver builds
        # cuda_utils (ldconfig, file, gcc on the H200, session 11). So the driver is answered here, before the call
        # sites are imported, as in a server; install() below finds it answered.
        from nojit.loader.runtimes.triton.driver import answer_from_torch

        answer_from_torch()

    # Memory the step allocates with torch.empty and a kernel leaves partly unwritten (the rejection sampler's
    # [num_reqs, k + 1] sampled tokens past a rejection, its per-request logsumexps) is read again by later kernels;
    # hashed as their input it must not be whatever the allocator held. Filled with a known value in both processes
    # (NaN, or the integer maximum); warn_only: no vLLM op is refused for being nondeterministic.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    if interpret and not torch.cuda.is_available():  # CPU validation: vLLM's eager-only branches ask this
        torch.cuda.is_current_stream_capturing = lambda: False
    from vllm_mount import mount

    finder = mount(args.vllm_src)
    call_site_steps = importlib.import_module(args.steps_module)

    modules = call_site_steps.import_call_sites()
    compiles: list[str] = []
    triton.knobs.runtime.jit_post_compile_hook = lambda **kw: compiles.append(str(kw.get("key"))[:80])
    tracer = LaunchTracer(args.child, device)
    if args.child == "loader" and args.replay and os.path.exists(args.replay):
        tracer.replay = torch.load(args.replay)
    call_site_steps.INDIRECT = tracer.indirect
    installed: list[str] = []
    if args.child == "loader":
        from nojit.loader.bundle.file import Bundle
        from nojit.loader.install import install

        bundle = Bundle.open(args.bundle)
        # kernels of the carried vLLM modules only: a stand-in module (vllm_mount STUBS) has no file and no kernel
        mounted = {k for k in bundle.index.kernels
                   if getattr(sys.modules.get(k.partition(":")[0]), "__file__", None)}
        # The device bundle is built from kernels extracted from vLLM (tools/prepare_device.py); here the kernels are
        # vLLM's verbatim modules, whose Triton cache_key can differ from the extracted copy's (it hashes globals and
        # callees as the module sees them). Served anyway, every difference printed; bit identity with the JIT of the
        # verbatim module is what this check asserts.
        inst = install(args.bundle, mode="strict", allow_mismatch=frozenset({"vllm", "source"}), kernels=mounted)
        for line in inst.allowed_differences:
            print(f"allowed difference: {line}", file=sys.stderr, flush=True)
        tracer.servers = dict(inst.servers("triton"))
        installed = sorted(inst.servers("triton"))
    # every kernel of every vLLM module loaded (the call sites' helpers launch kernels defined elsewhere too)
    loaded = [m for n, m in sorted(sys.modules.items()) if n.startswith("vllm.") and m is not None]
    _trace_every_kernel(tracer, [*modules, *loaded], interpret)
    steps: dict[str, Any] = {}
    t0 = time.perf_counter()
    wanted = set(args.steps.split(",")) if args.steps else set(call_site_steps.STEPS)
    for name, step in call_site_steps.STEPS.items():
        if name not in wanted:
            continue
        tracer.step = name
        first = len(tracer.launches)
        try:
            call_site_steps.ERRORS.clear()
            result = step(device, args.seed)
            errors = list(call_site_steps.ERRORS)
            steps[name] = {"ok": not errors, "result": {k: _digest(v) for k, v in (result or {}).items()}}
            if errors:
                steps[name]["error"] = "; ".join(errors)[:3000]
        except Exception as exc:
            steps[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                           "traceback": traceback.format_exc()[-3000:]}
        steps[name]["launches"] = len(tracer.launches) - first
    summary: dict[str, Any] = {"role": args.child, "import_errors": call_site_steps.IMPORT_ERRORS,
                               "steps": steps, "launches": tracer.launches,
                               "seconds": time.perf_counter() - t0, "compiles": compiles, "processes": events,
                               "processes_importing_torch": import_events,
                               "installed": installed, "carried_files": sorted(set(finder.loaded))}
    if args.child == "loader":
        from nojit.loader.strict import guards

        summary["guard_attempts"] = list(guards.compile_attempts)
        summary["served"] = dict(inst.policy.summary())
    with open(args.out, "w") as f:
        json.dump(summary, f)
    if args.child == "jit" and args.replay:
        torch.save(tracer.replay, args.replay)


def _trace_every_kernel(tracer: LaunchTracer, modules: list[Any], interpret: bool) -> None:
    """Wrap `run` of every Triton kernel defined in the call-site modules (and their owners' kernels)."""
    from triton.runtime.jit import JITFunction

    kinds: tuple[type, ...] = (JITFunction,)
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        kinds = (InterpretedFunction,)
    seen: set[int] = set()
    for fn in _kernels_of(modules, kinds):
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        current = fn.run  # nojit's server.run on bundled kernels in the loader, else the class's JIT run
        fn.run = tracer.wrap(fn, current)


def _kernels_of(modules: list[Any], kinds: tuple[type, ...]) -> list[Any]:
    """Kernels among the modules' names, also under @heuristics/@autotune. Only Triton's own wrappers are
    unwrapped: other names (TileLang's stand-in module in strict mode) are never probed for `fn`."""
    from triton.runtime.jit import KernelInterface

    out = []
    for m in modules:
        for value in vars(m).values():
            inner, depth = value, 0
            while not isinstance(inner, kinds) and isinstance(inner, KernelInterface) and depth < 4:
                inner, depth = inner.fn, depth + 1
            if isinstance(inner, kinds):
                out.append(inner)
            elif isinstance(value, type):
                for attr in vars(value).values():
                    inner = getattr(attr, "__func__", attr)
                    if isinstance(inner, kinds):
                        out.append(inner)
    return out


def list_sources(vllm_src: str, steps_module: str = "call_site_steps") -> dict[str, list[str]]:
    """The vLLM files (relative to vllm/) the call sites import, and the third-party packages they pull in."""
    import torch  # noqa: F401 - imported before the mount: not counted as the call sites' needs
    import triton  # noqa: F401

    before = {m.partition(".")[0] for m in sys.modules}
    from vllm_mount import mount

    finder = mount(vllm_src)
    call_site_steps = importlib.import_module(steps_module)

    call_site_steps.import_call_sites()
    if call_site_steps.IMPORT_ERRORS:  # on the build box every call-site module imports: else nothing to carry
        raise RuntimeError("call-site modules did not import: " + "; ".join(call_site_steps.IMPORT_ERRORS))
    after = {m.partition(".")[0] for m in sys.modules}
    third = sorted(m for m in after - before - set(sys.stdlib_module_names)
                   if not m.startswith("_") and m not in ("vllm", "vllm_mount", steps_module))
    return {"files": sorted(set(finder.loaded)), "third_party": third}


def dry_keys(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The build box's pre-check (no GPU, nothing launched): the steps run on CPU tensors with Triton's launches
    recorded (the build's recorder, under the build's offline driver), each call keyed as the JIT would key it, and
    the keys compared with --plan. kernel id -> {"reached": keys, "planned": how many of them the plan has}."""
    import torch

    from nojit.aot.runtimes.triton.compiler import offline_driver
    from nojit.aot.runtimes.triton.enumeration import recording_jit_calls
    from nojit.loader.bundle.canonical import canonical_json
    from vllm_mount import mount

    mount(args.vllm_src)
    steps = importlib.import_module(args.steps_module)
    steps.DRY = True
    steps.import_call_sites()
    if steps.IMPORT_ERRORS:
        raise RuntimeError("call-site modules did not import: " + "; ".join(steps.IMPORT_ERRORS))
    planned = planned_keys(args.plan)
    tracer = LaunchTracer("jit", "cpu")
    wanted = set(args.steps.split(",")) if args.steps else set(steps.STEPS)
    rows: dict[str, dict[str, Any]] = {}
    with offline_driver(), torch.inference_mode():
        for name, step in steps.STEPS.items():
            if name not in wanted:
                continue
            steps.ERRORS.clear()
            with recording_jit_calls() as calls:
                step("cpu", args.seed or 0)
            if steps.ERRORS:
                raise RuntimeError(f"step {name}: " + "; ".join(steps.ERRORS))
            for fn, a, kw in calls:
                kid = f"{fn.fn.__module__}:{fn.fn.__qualname__}"
                key = tracer._interpreted_key(fn, a, kw)["key"]
                text = "null" if key is None else canonical_json(key).decode()
                row = rows.setdefault(kid, {"reached": {}, "planned": 0, "steps": []})
                if name not in row["steps"]:
                    row["steps"].append(name)
                if text not in row["reached"]:
                    row["reached"][text] = text in planned.get(kid, ())
                    row["planned"] += row["reached"][text]
    return rows


def run_role(args: argparse.Namespace, role: str, workdir: str) -> dict:
    out = os.path.join(workdir, f"{role}.json")
    cmd = [sys.executable, __file__, "--child", role, "--vllm-src", args.vllm_src, "--seed", str(args.seed),
           "--out", out, "--steps-module", args.steps_module]
    if args.bundle:
        cmd += ["--bundle", args.bundle]
    if args.steps:
        cmd += ["--steps", args.steps]
    cmd += ["--replay", os.path.join(workdir, "jit_writes.pt")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        return {"error": f"{role} exited {p.returncode}: {p.stderr[-3000:]}"}
    with open(out) as f:
        return json.load(f)


def _by_ordinal(launches: list[dict]) -> dict[tuple[str, str, int], dict]:
    """Launches keyed by (step, kernel, n-th launch of that kernel in that step): a launch that aborts or is
    missing in one run shifts nothing else."""
    seen: collections.Counter = collections.Counter()
    out = {}
    for r in launches:
        at = (r["step"], r["kernel"])
        out[(*at, seen[at])] = r
        seen[at] += 1
    return out


def planned_keys(path: str) -> dict[str, set[str]]:
    """kernel id -> canonical JSON of each exact key a plan (`nojit build --emit-plan`) declares."""
    from nojit.aot.plan import Plan
    from nojit.loader.bundle.canonical import canonical_json

    out: dict[str, set[str]] = collections.defaultdict(set)
    for r in Plan.read(path).requests:
        if r.variant == "exact":
            out[r.kernel].add(canonical_json(r.key).decode())
    return out


def compare(jit: dict, loader: dict | None, planned: dict[str, set[str]] | None = None) -> tuple[list[dict], bool]:
    """Per kernel: keys reached, keys whose launches wrote, launches identical, outcomes, planned. And overall ok."""
    from nojit.loader.bundle.canonical import canonical_json

    per: dict[str, dict] = collections.defaultdict(lambda: {
        "launches": 0, "identical": 0, "keys": {}, "written_launches": 0, "writes": set(), "in_place": set(),
        "differ": []})
    jl = _by_ordinal(jit["launches"])
    ll = _by_ordinal(loader["launches"]) if loader else {}
    ok = not loader or set(ll) <= set(jl)  # the loader launched nothing the JIT did not
    for at, j in jl.items():
        lo = ll.get(at)
        k = per[j["kernel"]]
        k["launches"] += 1
        wrote = sum(j["written"].values()) > 0
        k["written_launches"] += wrote
        k["writes"] |= {n for n, c in j["written"].items() if c}
        k["in_place"] |= set(j.get("in_place", ()))
        if loader is not None and lo is None:  # the loader run never got there: not identical, key unknown
            lo = {"key": j.get("key"), "outcome": "not reached", "written": {}, "hashes": None}
        src = lo if lo is not None else j  # the loader keys every call; an interpreted JIT run keys them too
        if lo is not None:
            # same inputs (pre-state), same elements written, same outputs, and served from the bundle
            why = [what for what, same in (
                ("outputs", j["hashes"] is not None and lo["hashes"] == j["hashes"]),
                ("elements written", lo["written"] == j["written"]), ("inputs (pre-state)", lo.get("pre") == j.get("pre")),
                (f"served: {lo.get('outcome')}", lo.get("outcome") in ("exact", "generic"))) if not same]
            k["identical"] += not why
            if why:
                k["differ"].append(f"{at[0]} #{at[2]}: " + ", ".join(why))
        else:
            k["identical"] += 1
        keytext = json.dumps(src.get("key"), sort_keys=True)
        entry = k["keys"].setdefault(keytext, {"outcome": src.get("outcome", "-"), "written": False,
                                               "key": src.get("key"), "source_hash": src.get("source_hash")})
        if planned is not None:
            entry["planned"] = (src.get("key") is not None
                                and canonical_json(src["key"]).decode() in planned.get(j["kernel"], ()))
        entry["written"] |= wrote and (lo is None or sum(lo["written"].values()) > 0)
    rows = []
    for kid, k in sorted(per.items()):
        outcomes = collections.Counter(v["outcome"] for v in k["keys"].values())
        nkeys = len(k["keys"])
        written_keys = sum(v["written"] for v in k["keys"].values())
        unplanned = sum(not v.get("planned", True) for v in k["keys"].values())
        kernel_ok = (written_keys == nkeys and k["identical"] == k["launches"] and outcomes.get("miss", 0) == 0
                     and outcomes.get("not reached", 0) == 0 and unplanned == 0)
        ok &= kernel_ok
        rows.append({"kernel": kid, "keys": nkeys, "written": written_keys, "launches": k["launches"],
                     "identical": k["identical"], "exact": outcomes.get("exact", 0),
                     "generic": outcomes.get("generic", 0), "missing": outcomes.get("miss", 0),
                     "not_reached": outcomes.get("not reached", 0),
                     "planned": None if planned is None else nkeys - unplanned, "ok": kernel_ok,
                     "writes": sorted(k["writes"]), "in_place": sorted(k["in_place"]), "differ": k["differ"],
                     "key_list": list(k["keys"].values())})
    return rows, ok


def parser() -> argparse.ArgumentParser:
    """The check's arguments; check_one_process builds its loader child's from the same parser's defaults."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle")
    ap.add_argument("--vllm-src", default=os.path.join(ROOT, ".device", "vllm_src"))
    ap.add_argument("--interpret", action="store_true", help="CPU, TRITON_INTERPRET=1: the JIT role only")
    ap.add_argument("--observed", help="write the observed keys here (JSONL, NOJIT_MODE=record format)")
    ap.add_argument("--json", help="write the full report here")
    ap.add_argument("--plan", help="a plan (`nojit build --emit-plan`): every reached key must be in it")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--steps", help="comma-separated step names (default: all)")
    ap.add_argument("--steps-module", default="call_site_steps",
                    help="the module of tests/gpu/checks that holds the steps (qwen_call_site_steps: Qwen3.5)")
    ap.add_argument("--list-sources", action="store_true",
                    help="import the call sites from --vllm-src and print the vLLM files they load (JSON)")
    ap.add_argument("--dry-keys", action="store_true",
                    help="CPU, no launch: key every call of the steps and compare with --plan (exit 1 if one is unplanned)")
    ap.add_argument("--child")
    ap.add_argument("--replay", help="(child) what each JIT launch wrote: saved by the jit role, read by the loader")
    ap.add_argument("--out")
    return ap


def main() -> int:
    ap = parser()
    args = ap.parse_args()
    if args.list_sources:
        print(json.dumps(list_sources(args.vllm_src, args.steps_module)))
        return 0
    if args.dry_keys:
        if not args.plan:
            ap.error("--dry-keys needs --plan")
        rows = dry_keys(args)
        for kid, r in sorted(rows.items()):
            print(f"  {kid.rpartition(':')[2]:60} {r['planned']}/{len(r['reached'])} keys planned  ({', '.join(r['steps'])})")
            for text, ok in r["reached"].items():
                if not ok:
                    print(f"    reached, not planned: {text[:400]}")
        ok = all(r["planned"] == len(r["reached"]) for r in rows.values()) and bool(rows)
        print(f"DRY KEYS: {'PASS' if ok else 'FAIL'} ({len(rows)} kernels, {sum(len(r['reached']) for r in rows.values())} keys)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f)
        return 0 if ok else 1
    if args.child:
        child(args)
        return 0
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(3), "little")
    if not args.interpret and not args.bundle:
        ap.error("--bundle is required (or --interpret for the CPU run)")
    workdir = tempfile.mkdtemp(prefix="nojit-call-sites-")
    t0 = time.perf_counter()
    jit = run_role(args, "jit", workdir)
    loader = None if args.interpret else run_role(args, "loader", workdir)
    print(f"call sites: vLLM source {args.vllm_src}, seed {args.seed}, {time.perf_counter() - t0:.0f}s", flush=True)
    failed = [r for r in (jit, loader) if r and "error" in r]
    if failed:
        for r in failed:
            print(r["error"])
        print("\nRESULT: FAIL (a run did not finish)")
        return 1
    for role, r in (("jit", jit), ("loader", loader)):
        if r is None:
            continue
        for name, s in r["steps"].items():
            status = "ok" if s["ok"] else "ERROR " + s["error"].splitlines()[0][:150]
            print(f"  {role:6} step {name:24} {s['launches']:4} launches  {status}")
    rows, ok = compare(jit, loader, planned_keys(args.plan) if args.plan else None)
    steps_ok = all(s["ok"] for r in (jit, loader) if r for s in r["steps"].values())
    for role, r in (("jit", jit), ("loader", loader)):
        for line in (r or {}).get("import_errors", ()):
            print(f"  {role:6} call-site module did not import: {line}")
            steps_ok = False
    compiles = (len(loader["compiles"]) + len(loader["guard_attempts"])) if loader else 0
    procs = len(loader["processes"]) if loader else 0
    print_table(rows, compiles, procs, loader is not None)
    if loader and loader.get("processes_importing_torch"):
        print(f"(before the counted window: `import torch` started {loader['processes_importing_torch']}; "
              "a server imports torch before any plugin)")
    ok = ok and steps_ok and compiles == 0 and procs == 0
    if args.observed:
        write_observed(args.observed, rows)
    if args.json:
        with open(args.json, "w") as f:
            steps = {role: {n: {"ok": st["ok"], "launches": st["launches"], "error": st.get("error")}
                            for n, st in r["steps"].items()} for role, r in (("jit", jit), ("loader", loader)) if r}
            json.dump({"seed": args.seed, "result": "PASS" if ok else "FAIL", "compiles": compiles,
                       "processes": procs, "steps": steps, "rows": rows, "jit": jit, "loader": loader}, f)
    print(f"\nRESULT: {'PASS' if ok else 'FAIL'} ({len(rows)} kernels reached, {sum(r['keys'] for r in rows)} keys"
          f"{', JIT only (interpret)' if loader is None else ''})")
    return 0 if ok else 1


def print_table(rows: list[dict], compiles: int, procs: int, with_loader: bool) -> None:
    """The per-kernel table as Markdown (pasted as is into bench/RESULTS.md)."""
    header = ("kernel", "keys", "written", "launches identical", "compiles/procs", "exact", "generic", "missing",
              "planned", "writes (in place)", "ok")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        name = f"`{r['kernel'].rpartition(':')[2]}` ({r['kernel'].partition(':')[0].rpartition('.')[2]})"
        writes = ", ".join(f"{n}*" if n in r["in_place"] else n for n in r["writes"]) or "nothing"
        cells = (name, r["keys"], f"{r['written']}/{r['keys']}",
                 f"{r['identical']}/{r['launches']}" if with_loader else f"- ({r['launches']})",
                 f"{compiles}/{procs}" if with_loader else "-", r["exact"], r["generic"],
                 r["missing"] + r.get("not_reached", 0),
                 "-" if r.get("planned") is None else f"{r['planned']}/{r['keys']}", writes,
                 "yes" if r["ok"] else "**no**")
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print("(written: keys whose launches changed some output element, in both runs; * = updated in place, counted "
          "against the pre-state; missing includes launches the loader run never reached)")
    for r in rows:
        for line in r["differ"][:5]:
            print(f"  not identical: {r['kernel'].rpartition(':')[2]} {line}")


def write_observed(path: str, rows: list[dict]) -> None:
    """One JSON line per observed (kernel, key, outcome), in NOJIT_MODE=record's format."""
    with open(path, "w") as f:
        for r in rows:
            for k in r["key_list"]:
                f.write(json.dumps({"kernel": r["kernel"], "runtime": "triton", "key": k.get("key"),
                                    "outcome": k["outcome"], "source_hash": k.get("source_hash")},
                                   sort_keys=True, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    sys.exit(main())
