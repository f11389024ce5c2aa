"""Several deployments in one build: each planned on its own, common compiles done once.

Deployments of one model differ in serving limits, parallelism and speculative decoding, so
most of their keys are the same. Each deployment is planned in its own process (planning
installs the deployment's platform into the process, see vllm_env), the plans' requests are
merged, every distinct (kernel, key, variant) of deployments on the same platform facts is
compiled once (local process pool or Ray, build.compile_plan), and each bundle is assembled
from its own requests exactly as a single build would: the same bytes as building each
deployment alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from nojit.aot.build import BuildOptions, assemble, compile_plan
from nojit.aot.errors import BuildError
from nojit.aot.faces import CompileResult
from nojit.aot.plan import Plan, PlanRequest


def _plan_in_subprocess(deployment: str, plan_path: str, opts: BuildOptions) -> None:
    cmd = [sys.executable, "-m", "nojit.aot.cli", "build", "--deployment", deployment, "--plan-only",
           "--emit-plan", plan_path, "--quiet", "--runtime", ",".join(sorted(opts.runtimes)),
           "--generic" if opts.generic else "--no-generic"]
    if opts.kernels:
        cmd += ["--kernels", ",".join(opts.kernels)]
    if opts.groups:
        cmd += ["--groups", ",".join(sorted(opts.groups))]
    for keys in opts.add_keys:
        cmd += ["--add-keys", keys]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise BuildError(f"planning {deployment} failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}",
                         fix=f"run `nojit build --deployment {deployment} --plan-only --emit-plan P` to see why")


def _request_id(r: PlanRequest) -> str:
    return json.dumps([r.kernel, r.key, r.variant, r.compile_inputs], sort_keys=True)


def merge_plans(plans: list[Plan]) -> tuple[Plan, list[list[int]]]:
    """One plan with every distinct request of `plans` (same platform facts), and per plan the
    index in it of each of that plan's requests."""
    merged = Plan(deployment=plans[0].deployment, vllm=plans[0].vllm)
    where: dict[str, int] = {}
    mappings = []
    for plan in plans:
        for kid, k in plan.kernels.items():
            prev = merged.kernels.setdefault(kid, k)
            if prev.source_hash != k.source_hash:
                raise BuildError(f"{kid}: the deployments' plans saw different kernel sources", fix="plan them with one vLLM")
        mapping = []
        for r in plan.requests:
            rid = _request_id(r)
            if rid not in where:
                where[rid] = len(merged.requests)
                merged.requests.append(r)
            mapping.append(where[rid])
        mappings.append(mapping)
    return merged, mappings


def build_many(deployments: list[str], out_dir: str, opts: BuildOptions) -> dict[str, Any]:
    """Build one bundle per deployment file into out_dir; returns paths, compile counts and seconds."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nojit-plans-") as tmp:
        plan_paths = [os.path.join(tmp, f"{i}.plan.json") for i in range(len(deployments))]
        for d, p in zip(deployments, plan_paths):
            _plan_in_subprocess(d, p, opts)
        plans = [Plan.read(p) for p in plan_paths]
    t1 = time.perf_counter()
    groups: dict[str, list[int]] = {}
    for i, plan in enumerate(plans):
        groups.setdefault(json.dumps(plan.deployment["platform"], sort_keys=True), []).append(i)
    per_plan_results: dict[int, list[tuple[PlanRequest, CompileResult]]] = {}
    compiled = 0
    for members in groups.values():
        merged, mappings = merge_plans([plans[i] for i in members])
        done = compile_plan(merged, opts) if merged.requests else []
        by_request = {id(req): res for req, res in done}
        compiled += len(merged.requests)
        for i, mapping in zip(members, mappings):
            per_plan_results[i] = [(req, by_request[id(merged.requests[m])])
                                   for req, m in zip(plans[i].requests, mapping)]
    t2 = time.perf_counter()
    outputs = []
    for i, plan in enumerate(plans):
        out = os.path.join(out_dir, f"{plan.deployment['name']}.nojit")
        if out in outputs:
            raise BuildError(f"two deployments are named {plan.deployment['name']!r}", fix="give each deployment its own name")
        assemble(plan, per_plan_results[i], dataclasses.replace(opts, output=out))
        outputs.append(out)
    t3 = time.perf_counter()
    return {"outputs": outputs, "requests": sum(len(p.requests) for p in plans), "compiled": compiled,
            "seconds": {"plan": t1 - t0, "compile": t2 - t1, "write": t3 - t2, "total": t3 - t0}}
