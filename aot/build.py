"""`nojit build`: enumerate a deployment's keys, compile them in worker processes, write the bundle.

The plan (which kernel, which key, where it came from) is computed first, in this
process, by vLLM's own declarations; compiling is embarrassingly parallel and runs in
`jobs` spawned workers that each import only what they compile. A plan can be written out
(`--emit-plan`) and compiled elsewhere (`--from-plan`), e.g. on a machine with a different
Triton and no vLLM.
"""

from __future__ import annotations

import json
import os
import platform as py_platform
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from nojit.aot.deployment import Deployment
from nojit.aot.progress import Progress
from nojit.loader.errors import BuildError, NoJitError
from nojit.loader.manifest import Entry, KernelRecord, Manifest, Producer, Target
from nojit.loader.triton_key import generic_spec, key_from_json, key_to_json, layout_spec, runtime_params
from nojit.loader.versions import installed_version

PLAN_FORMAT = 1
NOJIT_VERSION = "0.1.0"


@dataclass
class Plan:
    """Everything to compile: kernels (identity, source hash) and requests (key + origin)."""

    deployment: dict[str, Any]
    vllm: str | None
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> {runtime, source_hash, params, info}
    requests: list[dict[str, Any]] = field(default_factory=list)  # {kernel, key, variant, origin, sample?}

    def to_json(self) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, "deployment": self.deployment, "vllm": self.vllm, "kernels": self.kernels,
                "requests": self.requests}

    @classmethod
    def read(cls, path: str) -> Plan:
        try:
            with open(path) as f:
                obj = json.load(f)
        except (OSError, ValueError) as exc:
            raise BuildError(f"cannot read plan {path}: {exc}", fix="write it with `nojit build --emit-plan`") from None
        if not isinstance(obj, dict) or obj.get("format") != PLAN_FORMAT:
            raise BuildError(f"{path} is not a nojit plan (format {PLAN_FORMAT})", fix="write it with `nojit build --emit-plan`")
        return cls(obj["deployment"], obj.get("vllm"), obj["kernels"], obj["requests"])

    def write(self, path: str) -> None:
        from nojit.aot.bundle_writer import write_text_atomically

        write_text_atomically(path, json.dumps(self.to_json(), indent=1, sort_keys=True))

    def add(self, kernel: str, key: Any, variant: str, origin: str, sample: dict | None = None) -> bool:
        """Add a request unless the same (kernel, key, variant) is already planned."""
        text = json.dumps(key, sort_keys=True)
        for r in self.requests:
            if r["kernel"] == kernel and r["variant"] == variant and json.dumps(r["key"], sort_keys=True) == text:
                return False
        req = {"kernel": kernel, "key": key, "variant": variant, "origin": origin}
        if sample is not None:
            req["sample"] = sample
        self.requests.append(req)
        return True


@dataclass
class BuildOptions:
    output: str
    deployment: Deployment | None = None
    groups: set[str] | None = None
    kernels: list[str] | None = None  # substrings of kernel ids to keep (default: all)
    runtimes: frozenset[str] = frozenset({"triton", "tilelang"})
    jobs: int = max(1, os.cpu_count() or 1)
    cache_dir: str = os.path.join(os.path.expanduser("~"), ".cache", "nojit")
    add_keys: list[str] = field(default_factory=list)
    plan_in: str | None = None
    plan_out: str | None = None
    kernel_sources: str | None = None
    merge: list[str] = field(default_factory=list)
    generic: bool = False
    progress: bool = True
    plan_only: bool = False  # stop after writing the plan (plan_out); nothing is compiled
    ray: str | None = None  # compile on the Ray cluster at this address instead of local processes


@dataclass
class BuildResult:
    manifest: Manifest | None  # None with plan_only
    seconds: dict[str, float]
    plan: Plan


# ------------------------------------------------------------------------------ planning
def plan_deployment(opts: BuildOptions) -> Plan:
    """Enumerate keys with vLLM's declarations (needs vLLM; no GPU)."""
    from nojit.aot.vllm_env import install_deployment_platform

    d = opts.deployment
    assert d is not None
    install_deployment_platform(d.platform)
    plan = Plan(deployment=d.as_dict(), vllm=installed_version("vllm"))
    if "tilelang" in opts.runtimes:
        from nojit.aot import tilelang_plan

        tilelang_plan.add_to_plan(plan, d)
    if "triton" in opts.runtimes:
        _plan_triton(plan, d, opts.groups, opts.kernels)
    if opts.kernels:
        keep = {k for k in plan.kernels if any(s in k for s in opts.kernels)}
        plan.kernels = {k: v for k, v in plan.kernels.items() if k in keep}
        plan.requests = [r for r in plan.requests if r["kernel"] in keep]
    return plan


def _plan_triton(plan: Plan, d: Deployment, groups: set[str] | None, kernels: list[str] | None) -> None:
    from nojit.aot.triton_derived import select_derived
    from nojit.aot.triton_enumerate import dedupe, enumerate_derived, enumerate_owner, jit_function_of, kernel_info
    from nojit.aot.triton_kernels import select_owners
    from nojit.aot.triton_offline import install_offline_driver
    from nojit.aot.kernel_sources import resolve_kernel
    from nojit.aot.vllm_config_view import make_vllm_config

    install_offline_driver()
    vllm_config = make_vllm_config(d)
    def add(requests: list, owner: str | None, site: str) -> None:
        for r in dedupe(requests):
            if r.kernel not in plan.kernels:
                fn = jit_function_of(resolve_kernel(r.kernel, None))
                info = kernel_info(fn, owner, site)
                plan.kernels[r.kernel] = {"runtime": "triton", "source_hash": info.source_hash,
                                          "params": list(info.params), "info": info.info}
            plan.add(r.kernel, key_to_json(r.key), "exact", r.origin, r.sample)

    for row in select_owners(groups):
        if not kernels or any(s in row.kernel for s in kernels):
            add(enumerate_owner(row, d, vllm_config), row.owner, row.site)
    for derived in select_derived(groups):
        if not kernels or any(s in derived.kernel for s in kernels):
            add(enumerate_derived(derived, d), None, derived.site)


def _use_source_map_hashes(plan: Plan, source_map_path: str) -> None:
    """With --kernel-sources the compiled source is the map's, so its digest is the one that counts."""
    from nojit.aot.kernel_sources import load_source_map, resolve_kernel
    from nojit.aot.triton_enumerate import jit_function_of

    source_map = load_source_map(source_map_path)
    for kid, k in plan.kernels.items():
        if k["runtime"] == "triton":
            k["source_hash"] = jit_function_of(resolve_kernel(kid, source_map)).cache_key


def add_recorded_keys(plan: Plan, paths: list[str]) -> int:
    """Merge keys recorded by NOJIT_MODE=record into the plan. Returns how many were new."""
    added = 0
    for path in paths:
        try:
            with open(path) as f:
                lines = f.readlines()
        except OSError as exc:
            raise BuildError(f"cannot read recorded keys {path}: {exc.strerror}", fix="pass the NOJIT_RECORD_FILE") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                kernel, key = rec["kernel"], rec["key"]
            except (ValueError, KeyError, TypeError):
                raise BuildError(f"{path}:{n} is not a nojit key record", fix="pass a file written by NOJIT_MODE=record") from None
            if key is None:
                continue  # a call the bundle cannot represent: nothing to compile
            if kernel not in plan.kernels:
                raise BuildError(
                    f"{path}:{n}: kernel {kernel} is not in this deployment's plan",
                    fix="add the kernel to nojit's kernel tables (aot/triton_kernels.py) or build its group",
                )
            if rec.get("source_hash") not in (None, plan.kernels[kernel]["source_hash"]):
                raise BuildError(f"{path}:{n}: key of {kernel} was recorded against other kernel source",
                                 fix="record again with the vLLM this bundle is built from")
            origin = f"recorded:{os.path.basename(path)}"
            if plan.kernels[kernel]["runtime"] == "tilelang":
                from nojit.aot.tilelang_plan import recorded_request

                if plan.add(kernel, key, "exact", origin):
                    plan.requests[-1]["extra"] = recorded_request(kernel, key)
                    added += 1
            else:
                added += plan.add(kernel, key, "exact", origin)
    return added


def add_generic_variants(plan: Plan) -> int:
    """Universal entries per distinct (kernel, constexpr/dtype/None combination): one laid out as
    each divisibility pattern of its exact keys (bit-identical to the JIT on such calls) and one
    with no marks at all (Triton's own cubin for a call with nothing specialized)."""
    added = 0
    for r in list(plan.requests):
        k = plan.kernels[r["kernel"]]
        if k["runtime"] != "triton" or r["variant"] != "exact":
            continue
        spec, options = key_from_json(r["key"])
        runtime_param = runtime_params(k["info"], len(spec))
        for generic in (layout_spec(spec, runtime_param), generic_spec(spec, runtime_param)):
            added += plan.add(r["kernel"], key_to_json((generic, options)), "generic", "fallback")
    return added


# ------------------------------------------------------------------------------ compiling
_worker_state: dict[str, Any] = {}


def _worker_init(facts: dict[str, Any] | None, cache_dir: str, source_map_path: str | None, tilelang: bool) -> None:
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
    os.environ["TILELANG_PRINT_ON_COMPILATION"] = "0"  # the build prints its own progress
    if facts is not None:
        from nojit.aot.vllm_env import PlatformFacts, install_deployment_platform

        install_deployment_platform(PlatformFacts(**{**facts, "capability": tuple(facts["capability"])}))
        if tilelang:  # vLLM's mHC module must see the deployment platform before any Triton module loads
            from nojit.aot.tilelang_enumerate import kernel_module

            kernel_module()
    from nojit.aot.kernel_sources import load_source_map
    from nojit.aot.triton_offline import install_offline_driver

    install_offline_driver()
    from nojit.aot.reproducible import canonical_source_paths

    canonical_source_paths()  # cubins independent of the install path (reproducible.py)
    _worker_state["source_map"] = load_source_map(source_map_path) if source_map_path else None
    _worker_state["cache_dir"] = cache_dir


def _compile_task(index: int, kernel: str, runtime: str, key: Any, variant: str, extra: dict[str, Any]) -> dict[str, Any]:
    """Runs in a worker: compile one request, return a picklable result (or an error)."""
    import hashlib

    try:
        if runtime == "triton":
            from nojit.aot.kernel_sources import resolve_kernel
            from nojit.aot.triton_enumerate import jit_function_of
            from nojit.aot.triton_offline import compile_key

            fn = jit_function_of(resolve_kernel(kernel, _worker_state["source_map"]))
            compiled = compile_key(fn, key_from_json(key), divisibility_assumed=variant == "exact")
            return {"index": index, "cubin": compiled.cubin, "launch": compiled.launch.to_json(),
                    "source_hash": fn.cache_key, "tool": {"ptxas": compiled.ptxas_version},
                    "sha": hashlib.sha256(compiled.cubin).hexdigest()}
        from nojit.aot import tilelang_plan

        result = tilelang_plan.compile_request(kernel, key, extra, _worker_state["cache_dir"])
        result["index"] = index
        return result
    except NoJitError as exc:
        return {"index": index, "error": f"{exc.message} (fix: {exc.fix})"}
    except Exception as exc:  # keep the worker alive; the parent reports kernel + key
        return {"index": index, "error": f"{type(exc).__name__}: {exc}"}


def compile_plan(plan: Plan, opts: BuildOptions) -> list[dict[str, Any]]:
    import multiprocessing

    facts = None if opts.kernel_sources else plan.deployment["platform"]
    todo = [(i, r) for i, r in enumerate(plan.requests)]
    results: list[dict[str, Any] | None] = [None] * len(todo)
    progress = Progress(len(todo), "compiling", enabled=opts.progress)
    ctx = multiprocessing.get_context("spawn")
    jobs = max(1, min(opts.jobs, len(todo) or 1))
    # Slow TileLang variants first so they do not end up alone at the tail.
    order = sorted(todo, key=lambda ir: 0 if plan.kernels[ir[1]["kernel"]]["runtime"] == "tilelang" else 1)
    has_tilelang = any(k["runtime"] == "tilelang" for k in plan.kernels.values())
    initargs = (facts, opts.cache_dir, opts.kernel_sources, has_tilelang)
    if opts.ray:  # the same workers on a Ray cluster (aot/ray_pool.py)
        from nojit.aot.ray_pool import RayExecutor

        executor = RayExecutor(opts.ray, jobs, _worker_init, initargs)
    else:
        executor = ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_worker_init, initargs=initargs)
    with executor as pool:
        futures = [
            pool.submit(_compile_task, i, r["kernel"], plan.kernels[r["kernel"]]["runtime"], r["key"], r["variant"],
                        r.get("extra", {}))
            for i, r in order
        ]
        errors = []
        for fut in as_completed(futures):
            res = fut.result()
            i = res["index"]
            if "error" in res:
                r = plan.requests[i]
                errors.append(f"{r['kernel']} key {json.dumps(r['key'])[:200]}: {res['error']}")
            results[i] = res
            progress.step(plan.requests[i]["kernel"].rpartition(":")[2])
    progress.done()
    if errors:
        raise BuildError(f"{len(errors)} of {len(todo)} compiles failed:\n  " + "\n  ".join(errors[:20]),
                         fix="see the messages above; nothing was written")
    return [r for r in results if r is not None]


# ------------------------------------------------------------------------------ assembling
def _producer(plan: Plan, tools: dict[str, str]) -> Producer:
    return Producer(
        nojit=NOJIT_VERSION,
        vllm=plan.vllm,
        triton=installed_version("triton") if any(k["runtime"] == "triton" for k in plan.kernels.values()) else None,
        tilelang=tools.get("tilelang") or (installed_version("tilelang")
                                           if any(k["runtime"] == "tilelang" for k in plan.kernels.values()) else None),
        ptxas=tools.get("ptxas"),
        nvcc=tools.get("nvcc"),
        python=py_platform.python_version(),
        torch=installed_version("torch"),
    )


def assemble(plan: Plan, results: list[dict[str, Any]], opts: BuildOptions) -> Manifest:
    from nojit.aot.bundle_writer import write_bundle
    from nojit.loader.bundle_file import Bundle
    from nojit.loader.manifest import TileLangLaunch, TritonLaunch, _Fields

    cubins: dict[str, bytes] = {}
    entries: list[Entry] = []
    tools: dict[str, str] = {}
    source_hash: dict[str, str] = {}
    for res in results:
        r = plan.requests[res["index"]]
        kernel = r["kernel"]
        runtime = plan.kernels[kernel]["runtime"]
        cubins[res["sha"]] = res["cubin"]
        fields = _Fields(res["launch"], "launch", "build")
        launch = TritonLaunch.from_json(fields) if runtime == "triton" else TileLangLaunch.from_json(fields)
        entries.append(Entry(kernel, r["key"], r["variant"], res["sha"], launch, r["origin"]))
        tools.update(res.get("tool", {}))
        plan.kernels[kernel]["info"].update(res.get("kernel_info", {}))
        prev = source_hash.setdefault(kernel, res["source_hash"])
        if prev != res["source_hash"]:
            raise BuildError(f"{kernel}: workers saw different kernel sources", fix="rebuild in a clean environment")
    kernels = []
    for kid, k in plan.kernels.items():
        # The hash of the source actually compiled (a source map may stand in for vLLM's).
        kernels.append(KernelRecord(kid, k["runtime"], source_hash.get(kid, k["source_hash"]), tuple(k["params"]), k["info"]))
    for other in opts.merge:
        b = Bundle.open(other)
        for kid, rec in b.manifest.kernels.items():
            if any(k.id == kid for k in kernels):
                raise BuildError(f"--merge {other}: kernel {kid} is also built here", fix="merge bundles with distinct kernels")
            kernels.append(rec)
        for e in b.manifest.entries:
            cubins[e.blob] = b.read_blob(e.blob)
            entries.append(e)
        for fact in ("tilelang", "nvcc"):
            value = getattr(b.manifest.producer, fact)
            if value:
                tools.setdefault(fact, value)
    target = Target(backend="cuda", capability=90, arch="sm_90a", warp_size=32)
    return write_bundle(opts.output, _producer(plan, tools), target, plan.deployment, kernels, entries, cubins)


def build(opts: BuildOptions) -> BuildResult:
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    if opts.plan_in:
        plan = Plan.read(opts.plan_in)
        keep = {k for k, v in plan.kernels.items() if v["runtime"] in opts.runtimes
                and (not opts.kernels or any(s in k for s in opts.kernels))}
        plan.kernels = {k: v for k, v in plan.kernels.items() if k in keep}
        plan.requests = [r for r in plan.requests if r["kernel"] in keep]
    else:
        plan = plan_deployment(opts)
    if opts.kernel_sources:
        _use_source_map_hashes(plan, opts.kernel_sources)
    if opts.add_keys:
        add_recorded_keys(plan, opts.add_keys)
    if opts.generic:
        add_generic_variants(plan)
    seconds["plan"] = time.perf_counter() - t0
    if opts.plan_out:
        plan.write(opts.plan_out)
    if opts.plan_only:
        return BuildResult(None, seconds, plan)
    t1 = time.perf_counter()
    results = compile_plan(plan, opts) if plan.requests else []
    seconds["compile"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    manifest = assemble(plan, results, opts)
    seconds["write"] = time.perf_counter() - t2
    seconds["total"] = time.perf_counter() - t0
    return BuildResult(manifest, seconds, plan)

