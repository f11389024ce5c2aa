"""`nojit build`: plan a deployment's keys, compile them in worker processes, write the bundle.

The plan (which kernel, which key, where it came from) is computed first, in this process, by
each runtime's planner over the deployment's model tables; compiling is embarrassingly
parallel and runs through an executor (pool.py) whose workers each import only what they
compile. A plan can be written out (`--emit-plan`) and compiled elsewhere (`--from-plan`),
e.g. on a machine with a different Triton and no vLLM.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform as py_platform
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import version as package_version
from typing import Any

from nojit.aot.build_log import Terminal
from nojit.aot.bundle_writer import write_bundle
from nojit.aot.compile_cache import DEFAULT_CACHE_DIR, CompileCache
from nojit.aot.compile_times import CompileTimes
from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.faces import CompileResult, Selection, WorkerSettings
from nojit.aot.models import model_for
from nojit.aot.plan import Plan, PlanRequest
from nojit.aot.pool import Executor, LocalProcessExecutor
from nojit.aot.ray_pool import RayExecutor
from nojit.aot.progress import Progress, clock
from nojit.aot.reproducible import canonical_source_paths
from nojit.aot.runtimes import RUNTIMES, runtime
from nojit.aot.vllm_env import PlatformFacts, install_deployment_platform
from nojit.loader.bundle.file import Bundle
from nojit.loader.errors import NoJitError
from nojit.aot.target import TARGET
from nojit.loader.bundle.manifest import Entry, KernelRecord, Manifest, Producer
from nojit.loader.strict.toolchain import probe as probe_toolchain
from nojit.loader.bundle.versions import installed_version


@dataclass
class BuildOptions:
    output: str
    deployment: Deployment | None = None
    groups: set[str] | None = None
    kernels: list[str] | None = None  # substrings of kernel ids to keep (default: all)
    runtimes: frozenset[str] = frozenset(RUNTIMES)
    jobs: int = max(1, os.cpu_count() or 1)
    cache_dir: str = DEFAULT_CACHE_DIR
    add_keys: list[str] = field(default_factory=list)
    plan_in: str | None = None
    plan_out: str | None = None
    kernel_sources: str | None = None
    merge: list[str] = field(default_factory=list)
    generic: bool = True  # as the CLI: generic entries unless --no-generic
    progress: bool = True
    plan_only: bool = False  # stop after writing the plan (plan_out); nothing is compiled
    executor: Executor | None = None  # default: LocalProcessExecutor(jobs)
    ray: str | None = None  # compile on the Ray cluster at this address (aot/ray_pool.py)
    compile_cache: bool = True  # reuse compile results under cache_dir/compiled (aot/compile_cache.py)
    terminal: Terminal | None = None  # where the plan line and the progress bar go (build_log.py; default: stdio)


@dataclass
class BuildResult:
    manifest: Manifest | None  # None with plan_only
    seconds: dict[str, float]
    plan: Plan


# ------------------------------------------------------------------------------ planning
def plan_deployment(opts: BuildOptions) -> Plan:
    """Enumerate keys with vLLM's declarations (needs vLLM; no GPU)."""
    d = opts.deployment
    assert d is not None
    model = model_for(d.hf_config, d.hf_config_source)
    model.check_deployment(d)
    install_deployment_platform(d.platform)
    plan = Plan(deployment=d.as_dict(), vllm=installed_version("vllm"))
    selection = Selection(opts.groups, opts.kernels, opts.cache_dir)
    for rt in RUNTIMES.values():
        if rt.name in opts.runtimes:
            rt.plan(plan, d, model, selection)
    if opts.kernels:
        plan.keep_kernels(lambda kid, _k: selection.wants(kid))
    return plan


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
            if key is None or isinstance(key, dict) and "tuning_key" in key:
                continue  # a call the bundle cannot represent, or an autotuner's tuning key: nothing to compile
            if kernel not in plan.kernels:
                raise BuildError(
                    f"{path}:{n}: kernel {kernel} is not in this deployment's plan",
                    fix="add the kernel to its model's tables (aot/models/) or build its group",
                )
            if rec.get("source_hash") not in (None, plan.kernels[kernel].source_hash):
                raise BuildError(f"{path}:{n}: key of {kernel} was recorded against other kernel source",
                                 fix="record again with the vLLM this bundle is built from")
            rt = runtime(plan.kernels[kernel].runtime)
            inputs = rt.recorded_inputs(kernel, key) if rt.recorded_inputs else {}
            added += plan.add(PlanRequest(kernel, key, "exact", f"recorded:{os.path.basename(path)}",
                                          compile_inputs=inputs))
    return added


def add_generic_variants(plan: Plan) -> int:
    """Every runtime's generic entries for the plan's exact keys."""
    return sum(rt.add_generic(plan) for rt in RUNTIMES.values() if rt.add_generic and rt.name in plan.runtimes())


# ------------------------------------------------------------------------------ compiling
_worker: dict[str, WorkerSettings] = {}


def _worker_init(facts: dict[str, Any] | None, settings: WorkerSettings, runtimes: list[str]) -> None:
    os.environ["TRITON_CACHE_DIR"] = os.path.join(settings.cache_dir, "triton")
    os.environ["TILELANG_PRINT_ON_COMPILATION"] = "0"  # the build prints its own progress
    if facts is not None:
        install_deployment_platform(PlatformFacts(**{**facts, "capability": tuple(facts["capability"])}))
    canonical_source_paths()  # cubins independent of the install path (reproducible.py)
    for name in runtimes:
        runtime(name).prepare_worker(settings)
    _worker["settings"] = settings


def _compile_task(index: int, request: PlanRequest, kernel: Any) -> tuple[int, CompileResult | str, float]:
    """Runs in a worker: compile one request; an error comes back as text (kernel and key added by the parent).
    The seconds it took come back too (compile_times.py: the next plan's estimate)."""
    t0 = time.perf_counter()
    try:
        result: CompileResult | str = runtime(kernel.runtime).compile(request, request.kernel, kernel,
                                                                      _worker["settings"])
    except NoJitError as exc:
        result = f"{exc.message} (fix: {exc.fix})"
    except Exception as exc:  # keep the worker alive; the parent reports kernel + key
        result = f"{type(exc).__name__}: {exc}"
    return index, result, time.perf_counter() - t0


def plan_line(plan: Plan, cached: int, todo: list[int], times: CompileTimes | None, jobs: int) -> str:
    """What the build is about to do, before it does it: runtimes, keys, cached, to compile, and how long."""
    exact = sum(r.variant == "exact" for r in plan.requests)
    runtimes = ", ".join(sorted(plan.runtimes()))
    line = (f"plan: {len(plan.kernels)} kernels ({runtimes}), {exact} keys + {len(plan.requests) - exact} generic "
            f"entries; {cached} of {len(plan.requests)} in the compile cache, {len(todo)} to compile")
    if not todo:
        return line
    guesses = [times.guess(plan.requests[i].kernel, plan.kernels[plan.requests[i].kernel].runtime) if times else None
               for i in todo]
    known = [g for g in guesses if g is not None]
    if not known:
        return line + " (no estimate: no compile times recorded yet)"
    mean = sum(known) / len(known)
    total = (sum(known) + mean * (len(guesses) - len(known))) / max(1, min(jobs, len(todo)))
    unknown = f", {len(guesses) - len(known)} at the mean" if len(known) < len(guesses) else ""
    return line + f", about {clock(total)} on {jobs} job{'s' if jobs != 1 else ''} (recorded compile times{unknown})"


def compile_plan(plan: Plan, opts: BuildOptions) -> list[tuple[PlanRequest, CompileResult]]:
    facts = None if opts.kernel_sources else plan.deployment["platform"]
    settings = WorkerSettings(opts.cache_dir, opts.kernel_sources, platform_installed=facts is not None)
    in_plan = [name for name in RUNTIMES if name in plan.runtimes()]
    # Runtimes in registry order: the slow TileLang compiles first, so they do not end up alone at the tail.
    rank = {name: i for i, name in enumerate(RUNTIMES)}
    order = sorted(range(len(plan.requests)), key=lambda i: rank[plan.kernels[plan.requests[i].kernel].runtime])
    results: dict[int, CompileResult] = {}
    cache = CompileCache(os.path.join(opts.cache_dir, "compiled")) if opts.compile_cache else None
    inputs: dict[int, dict[str, Any]] = {}
    if cache is not None:  # hits are taken here, in the parent: no worker starts for a build that compiles nothing
        for i in order:
            r, k = plan.requests[i], plan.kernels[plan.requests[i].kernel]
            found = cache.lookup(runtime(k.runtime), r, k)
            if isinstance(found, CompileResult):
                results[i] = found
            elif found is not None:
                inputs[i] = found
    todo = [i for i in order if i not in results]
    times = CompileTimes(os.path.join(opts.cache_dir, "compiled")) if cache is not None else None
    terminal = opts.terminal or Terminal(sys.stdout, sys.stderr)
    if opts.progress:
        print(plan_line(plan, len(results), todo, times, opts.jobs), file=terminal.out, flush=True)
    errors = []
    if todo:
        executor = opts.executor or (RayExecutor(opts.ray, opts.jobs) if opts.ray else LocalProcessExecutor(opts.jobs))
        progress = Progress(len(todo), "compiling", enabled=opts.progress, stream=terminal.err)
        tasks = [(i, plan.requests[i], plan.kernels[plan.requests[i].kernel]) for i in todo]
        for i, res, seconds in executor.run(_compile_task, tasks, _worker_init, (facts, settings, in_plan)):
            r = plan.requests[i]
            if isinstance(res, str):
                errors.append(f"{r.kernel} key {json.dumps(r.key)[:200]}: {res}")
            else:
                results[i] = res
                if cache is not None and i in inputs:
                    cache.store(runtime(plan.kernels[r.kernel].runtime), inputs[i], res)
                if times is not None:
                    times.record(r.kernel, plan.kernels[r.kernel].runtime, seconds)
            progress.step(r.kernel.rpartition(":")[2])
        progress.done()
        if times is not None:
            times.save()
    if errors:
        raise BuildError(f"{len(errors)} of {len(order)} compiles failed:\n  " + "\n  ".join(errors[:20]),
                         fix="see the messages above; nothing was written")
    return [(plan.requests[i], results[i]) for i in sorted(results)]


# ------------------------------------------------------------------------------ assembling
def _producer(plan: Plan, tools: dict[str, str]) -> Producer:
    runtimes = plan.runtimes()
    return Producer(
        nojit=package_version("nojit"),
        vllm=plan.vllm,
        triton=installed_version("triton") if "triton" in runtimes else None,
        tilelang=tools.get("tilelang") or (installed_version("tilelang") if "tilelang" in runtimes else None),
        ptxas=tools.get("ptxas"),
        nvcc=tools.get("nvcc"),
        python=py_platform.python_version(),
        torch=installed_version("torch"),
        toolchain=probe_toolchain() or None,  # replayed by strict mode's compiler stand-ins (loader/strict/firewall.py)
    )


def assemble(plan: Plan, results: list[tuple[PlanRequest, CompileResult]], opts: BuildOptions) -> Manifest:
    cubins: dict[str, bytes] = {}
    entries: list[Entry] = []
    tools: dict[str, str] = {}
    source_hash: dict[str, str] = {}
    for r, res in results:
        sha = hashlib.sha256(res.cubin).hexdigest()
        cubins[sha] = res.cubin
        entries.append(Entry(r.kernel, r.key, r.variant, sha, res.launch, r.origin))
        tools.update(res.tools)
        plan.kernels[r.kernel].info.update(res.kernel_info)
        prev = source_hash.setdefault(r.kernel, res.source_hash)
        if prev != res.source_hash:
            raise BuildError(f"{r.kernel}: workers saw different kernel sources", fix="rebuild in a clean environment")
    kernels = []
    for kid, k in plan.kernels.items():
        # The hash of the source actually compiled (a source map may stand in for vLLM's).
        kernels.append(KernelRecord(kid, k.runtime, source_hash.get(kid, k.source_hash), tuple(k.params), k.info))
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
    return write_bundle(opts.output, _producer(plan, tools), TARGET, plan.deployment, kernels, entries, cubins)


def _read_plan(opts: BuildOptions) -> Plan:
    plan = Plan.read(opts.plan_in or "")
    selection = Selection(kernels=opts.kernels)
    plan.keep_kernels(lambda kid, k: k.runtime in opts.runtimes and selection.wants(kid))
    if not opts.generic:  # a plan emitted with generic entries, built with --no-generic: exact keys only
        plan.keep_requests(lambda r: r.variant == "exact")
    return plan


def build(opts: BuildOptions) -> BuildResult:
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    if opts.progress and not opts.plan_in and opts.deployment is not None:
        print(f"planning {opts.deployment.name} ({', '.join(sorted(opts.runtimes))}) with vLLM's own declarations ...",
              file=(opts.terminal or Terminal(sys.stdout, sys.stderr)).out, flush=True)
    plan = _read_plan(opts) if opts.plan_in else plan_deployment(opts)
    if opts.kernel_sources:
        for rt in RUNTIMES.values():
            if rt.use_source_map:
                rt.use_source_map(plan, opts.kernel_sources)
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
