"""Autotuned Triton kernels served with no JIT, on the GPU, against Triton's own autotuner (issue 24).

vLLM's FLA kernels are imported from a verbatim copy of their files (.device/vllm_src, tests/gpu/checks/vllm_mount.py)
and driven through FLA's public functions (`chunk_local_cumsum` fixed-length and varlen, `solve_tril`). Each role
runs in its own process:

  plan   Triton's own Autotuner.run on this machine's Triton, recorded (aot/runtimes/triton/autotune.py): every
         tuning key and its pruned configs; then `nojit build --from-plan` compiles them (kernel sources: shims
         that import the mounted vLLM modules)
  a      the bundle, strict: Triton's autotuner benchmarks the bundled cubins (its benchmarker from nojit's driver)
  tune   `nojit tune`'s code: each key's configs timed with the bundle's cubins, winners into a new bundle
  b      the tuned bundle, strict: the autotuner's cache pre-filled, no benchmark at all
  jit    no nojit, an empty Triton cache: Triton's own autotuner from scratch (the configs it considers, its
         winner), then the call again with each config a/b chose forced into its cache

Passes when, for every case, a's and b's winners are among the configs the JIT's autotuner considered, each output
equals (bit for bit) the JIT's output with that config, b benchmarked nothing, and nothing compiled in a and b.
Outputs are poisoned (torch.empty/empty_like fill NaN / the integer maximum) before each run.

NOJIT_AUTOTUNE_CASES=qwen drives Qwen3.5's Triton GDN prefill instead (`--gdn-prefill-backend triton`): FLA's
`chunk_gated_delta_rule` as vLLM's `forward_native` calls it with the built-in deployment's layer (16 key / 32 value
heads of 128, bf16, fp32 gates and state, two sequences, an initial state, no in-kernel l2norm): six autotuned kernels
in one call, so the JIT side forces all of a's (then b's) winners at once and the output is compared with that run.

    python3 tests/gpu/checks/check_autotune.py --vllm-src .device/vllm_src --work /tmp/w/autotune [--json OUT.json]
    python3 tests/gpu/checks/check_autotune.py --list-sources --vllm-src SITE   (what tools/prepare_device.py carries)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

OPS = "vllm.third_party.flash_linear_attention.ops"
CASE_SET = os.environ.get("NOJIT_AUTOTUNE_CASES", "fla")  # children inherit it
MODULES = {"fla": (f"{OPS}.cumsum", f"{OPS}.solve_tril"),
           "qwen": (f"{OPS}.chunk", f"{OPS}.cumsum", f"{OPS}.chunk_scaled_dot_kkt", f"{OPS}.solve_tril",
                    f"{OPS}.wy_fast", f"{OPS}.chunk_delta_h", f"{OPS}.chunk_o")}[CASE_SET]


def qwen_cases(device: str) -> list[tuple[str, Any]]:
    """FLA's chunk_gated_delta_rule with vLLM's forward_native arguments for Qwen3.5-35B-A3B at TP 1
    (aot/models/qwen3_5/fla_prefill.py): q, k l2-normalized as fused_post_conv_prep leaves them."""
    import torch
    import torch.nn.functional as F

    chunk = sys.modules[f"{OPS}.chunk"]
    gen = torch.Generator(device="cpu").manual_seed(0)
    T, H, HV, D = 300, 16, 32, 128
    q, k = (F.normalize(torch.randn(1, T, H, D, generator=gen), dim=-1).to(device, torch.bfloat16) for _ in range(2))
    v = torch.randn(1, T, HV, D, generator=gen).to(device, torch.bfloat16)
    g = F.logsigmoid(torch.randn(1, T, HV, generator=gen)).to(device)
    beta = torch.sigmoid(torch.randn(1, T, HV, generator=gen)).to(device)
    h0 = (torch.randn(2, HV, D, D, generator=gen) * 0.05).to(device)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32, device=device)

    def call() -> Any:
        o, ht = chunk.chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                             cu_seqlens=cu, use_qk_l2norm_in_kernel=False)
        return torch.cat([o.float().reshape(-1), ht.reshape(-1)])
    return [("qwen_chunk_gdr", call)]


def cases(device: str) -> list[tuple[str, Any]]:
    """(name, thunk) per call: FLA's public functions as vLLM's GDN prefill calls them (chunk size 64)."""
    import torch

    if CASE_SET == "qwen":
        return qwen_cases(device)

    cumsum, solve_tril = (sys.modules[m] for m in MODULES)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> Any:
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    g = randn(1, 256, 4)
    gv = randn(1, 300, 8)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32, device=device)
    T, H, BT = 128, 4, 64
    a = torch.randn(1, T, H, BT, generator=gen) * 0.05
    row = torch.arange(T).view(1, T, 1, 1) % BT
    a = torch.where(torch.arange(BT).view(1, 1, 1, BT) < row, a, torch.zeros_like(a)).to(device)  # strictly lower
    return [
        ("cumsum_fixed", lambda: cumsum.chunk_local_cumsum(g, 64)),
        ("cumsum_varlen", lambda: cumsum.chunk_local_cumsum(gv, 64, cu_seqlens=cu)),
        ("solve_tril", lambda: solve_tril.solve_tril(a, output_dtype=torch.float32)),
    ]


def _import() -> None:
    import importlib

    for m in MODULES:
        importlib.import_module(m)


def _poison() -> None:
    """torch.empty / empty_like hand out poisoned memory (what a kernel leaves unwritten shows)."""
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True


def _autotuners() -> dict[str, Any]:
    from triton.runtime.autotuner import Autotuner

    out = {}
    for m in MODULES:
        for name, obj in vars(sys.modules[m]).items():
            x = obj
            while x is not None:
                if isinstance(x, Autotuner):
                    out[f"{m}:{name}"] = x
                    break
                x = getattr(x, "fn", None)
    return out


def _config(c: Any) -> str:
    from nojit.loader.bundle.autotune import config_identity

    return config_identity(c.all_kwargs())


def _bits(t: Any) -> list[int]:
    import torch

    t = t.detach().contiguous()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return [int(x) for x in t.view(view).reshape(-1).cpu().tolist()]


def _run_case(thunk: Any, tuners: dict[str, Any]) -> dict[str, Any]:
    """Call once; the tuning key each autotuner asked for, the config it used, the output's bits."""
    import torch

    before = {k: set(dict.keys(a.cache)) for k, a in tuners.items()}
    used = {k: a.__dict__.pop("best_config", None) for k, a in tuners.items()}
    out = thunk()
    torch.cuda.synchronize()
    ran = {}
    for k, a in tuners.items():
        if "best_config" in a.__dict__:
            new = set(dict.keys(a.cache)) - before[k]
            ran[k] = {"config": _config(a.best_config), "new_keys": [repr(x) for x in new]}
        elif used[k] is not None:
            a.best_config = used[k]
    return {"autotuned": ran, "output": _bits(out), "dtype": str(out.dtype), "shape": list(out.shape)}


# ------------------------------------------------------------------------------------------------ roles
def role_plan(args: argparse.Namespace) -> dict:
    from nojit.aot.plan import Plan
    from nojit.aot.runtimes.triton import enumeration
    import importlib

    from nojit.aot.runtimes.triton import planner
    from nojit.aot.runtimes.triton.planner import add_requests
    from nojit.loader.resolve import resolve_object

    # the mounted copy is not an installed vLLM: kernels resolve from the mounted modules, paths stay as they are
    enumeration._package_relative = lambda path: path
    planner.resolve_kernel = lambda kid, source_map: resolve_object(kid, import_module=importlib.import_module)
    _import()
    plan = Plan({"name": "fla-autotune-device", "platform": {}}, "0.33.0")
    for name, thunk in cases(args.device):
        add_requests(plan, enumeration.enumerate_calls(thunk, f"check_autotune:{name}"), None, "check_autotune")
    plan.write(args.out)
    # shims for --kernel-sources: each imports the mounted module (the kernels are vLLM's own objects)
    shims = os.path.join(os.path.dirname(args.out), "shims")
    os.makedirs(shims, exist_ok=True)
    mapping = {}
    for kid in plan.kernels:
        module, _, qualname = kid.partition(":")
        name = module.replace(".", "_") + ".py"
        with open(os.path.join(shims, name), "w") as f:
            f.write(f"import sys\nsys.path.insert(0, {HERE!r})\nfrom vllm_mount import VllmFinder, mount\n"
                    f"if not any(isinstance(f, VllmFinder) for f in sys.meta_path):\n    mount({os.path.abspath(args.vllm_src)!r})\n"
                    f"from {module} import *  # noqa\n")
        mapping[kid] = {"file": name, "qualname": qualname}
    with open(os.path.join(shims, "map.json"), "w") as f:
        json.dump(mapping, f, indent=1)
    return {"kernels": {k: len(v.info.get("autotune", {}).get("keys", [])) for k, v in plan.kernels.items()},
            "requests": len(plan.requests)}


def _serve(bundle: str) -> tuple[Any, list[int], list[str]]:
    import triton
    import triton.testing

    from nojit.loader.install import install

    benched: list[int] = []
    real = triton.testing.do_bench

    def counting(fn: Any, *a: Any, **kw: Any) -> Any:
        benched.append(1)
        return real(fn, *a, **kw)

    triton.testing.do_bench = counting  # what nojit's driver's get_benchmarker hands the autotuner
    compiles: list[str] = []
    triton.knobs.runtime.jit_post_compile_hook = lambda **kw: compiles.append(str(kw.get("key"))[:80])
    inst = install(bundle, mode="strict", allow_mismatch=frozenset({"vllm", "source"}))
    return inst, benched, compiles


def role_serve(args: argparse.Namespace) -> dict:
    _import()
    inst, benched, compiles = _serve(args.bundle)
    tuners = _autotuners()
    out = {}
    for name, thunk in cases("cuda"):
        n = len(benched)
        out[name] = _run_case(thunk, tuners)
        out[name]["benchmarks"] = len(benched) - n
    return {"cases": out, "compiles": compiles, "policy": inst.policy.summary(),
            "note": inst.state("triton").startup_note()}


def role_tune(args: argparse.Namespace) -> dict:
    from nojit.aot.tune import tune

    _import()
    result = tune(args.bundle, args.out)  # NOJIT_ALLOW_MISMATCH=vllm,source: set by the parent
    return {"winners": {k: {repr(key): i for key, i in v.items()} for k, v in result.winners.items()},
            "skipped": result.skipped}


def role_jit(args: argparse.Namespace) -> dict:
    import triton

    _import()
    compiles: list[str] = []
    triton.knobs.runtime.jit_post_compile_hook = lambda **kw: compiles.append(str(kw.get("key"))[:80])
    tuners = _autotuners()
    forced = json.load(open(args.forced)) if args.forced else {}
    out = {}
    for name, thunk in cases("cuda"):
        first = _run_case(thunk, tuners)  # Triton's autotuner from an empty cache
        considered = {}
        for k, a in tuners.items():
            if k in first["autotuned"]:
                considered[k] = sorted(_config(c) for c in getattr(a, "configs_timings", {}) or {a.best_config: 0})
        out[name] = {"jit": first, "considered": considered, "forced": {}, "forced_sides": {}}
        for side, chosen in forced.get(name, {}).pop("__sides__", {}).items():  # several autotuners: all at once
            for k, cid in chosen.items():
                (key,) = [x for x in dict.keys(tuners[k].cache) if repr(x) in first["autotuned"][k]["new_keys"]]
                dict.__setitem__(tuners[k].cache, key, {_config(c): c for c in tuners[k].configs}[cid])
            out[name]["forced_sides"][side] = _run_case(thunk, tuners)
        for k, configs in forced.get(name, {}).items():
            a = tuners[k]
            (key,) = [x for x in dict.keys(a.cache) if repr(x) in first["autotuned"][k]["new_keys"]]
            live = {_config(c): c for c in a.configs}
            for cid in configs:
                dict.__setitem__(a.cache, key, live[cid])
                out[name]["forced"][cid] = _run_case(thunk, tuners)
    return {"cases": out, "compiles": len(compiles)}


ROLES = {"plan": role_plan, "a": role_serve, "b": role_serve, "tune": role_tune, "jit": role_jit}


def child(args: argparse.Namespace) -> int:
    _poison()
    from vllm_mount import mount

    mount(args.vllm_src)
    result = ROLES[args.role](args)
    with open(args.json_out, "w") as f:
        json.dump(result, f)
    return 0


def run(role: str, args: argparse.Namespace, *extra: str, env: dict | None = None) -> dict:
    out = os.path.join(args.work, f"role-{role}.json")  # not plan.json: the plan role writes that one
    cmd = [sys.executable, __file__, "--role", role, "--vllm-src", args.vllm_src, "--json-out", out, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=1200)
    if p.returncode != 0:
        raise SystemExit(f"role {role} exited {p.returncode}:\n{p.stderr[-4000:]}")
    with open(out) as f:
        return json.load(f)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm-src", required=True)
    ap.add_argument("--work", default="/tmp/nojit-autotune")
    ap.add_argument("--json")
    ap.add_argument("--role", choices=sorted(ROLES))
    ap.add_argument("--json-out")
    ap.add_argument("--bundle")
    ap.add_argument("--out")
    ap.add_argument("--forced")
    ap.add_argument("--list-sources", action="store_true")
    ap.add_argument("--device", default="cuda", help="role plan only: where the enumeration's tensors live")
    args = ap.parse_args()
    if args.list_sources:
        return list_sources(args.vllm_src)
    if args.role:
        return child(args)
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("SKIP: check_autotune needs an sm_90 GPU")
        return 0
    os.makedirs(args.work, exist_ok=True)
    w = args.work
    plan = run("plan", args, "--out", f"{w}/plan.json")
    print("plan:", plan, flush=True)
    b = subprocess.run([sys.executable, "-m", "nojit.aot.cli", "build", "--from-plan", f"{w}/plan.json",
                        "--kernel-sources", f"{w}/shims/map.json", "--runtime", "triton", "--no-generic", "-j", "16",
                        "--quiet", "-o", f"{w}/fla.nojit"], capture_output=True, text=True)
    print(b.stdout[-1500:], b.stderr[-3000:], flush=True)
    if b.returncode:
        return 1
    a = run("a", args, "--bundle", f"{w}/fla.nojit")
    tuned = run("tune", args, "--bundle", f"{w}/fla.nojit", "--out", f"{w}/fla.tuned.nojit",
                env={"NOJIT_ALLOW_MISMATCH": "vllm,source"})
    print("tune:", tuned, flush=True)
    bb = run("b", args, "--bundle", f"{w}/fla.tuned.nojit")
    forced: dict[str, dict[str, list[str]]] = {}
    for label, side in (("a", a), ("b", bb)):
        for name, case in side["cases"].items():
            if len(case["autotuned"]) > 1:  # one output from several autotuners: the JIT runs with all of them
                forced.setdefault(name, {}).setdefault("__sides__", {})[label] = {
                    k: ran["config"] for k, ran in case["autotuned"].items()}
                continue
            for k, ran in case["autotuned"].items():
                forced.setdefault(name, {}).setdefault(k, [])
                if ran["config"] not in forced[name][k]:
                    forced[name][k].append(ran["config"])
    with open(f"{w}/forced.json", "w") as f:
        json.dump(forced, f)
    import tempfile

    jit = run("jit", args, "--forced", f"{w}/forced.json", env={"TRITON_CACHE_DIR": tempfile.mkdtemp(dir=w)})
    ok = True
    rows = []
    for name in a["cases"]:
        j = jit["cases"][name]
        for mode, side in (("a", a), ("b", bb)):
            case = side["cases"][name]
            if not case["autotuned"]:
                ok = False
                rows.append(f"{name:14} {mode}: FAIL no autotuned kernel ran")
            for k, ran in case["autotuned"].items():
                among = ran["config"] in j["considered"].get(k, [])
                forced_run = (j["forced_sides"].get(mode) if len(case["autotuned"]) > 1
                              else j["forced"].get(ran["config"]))
                same = (forced_run or {}).get("output") == case["output"]
                no_bench = mode == "a" or case["benchmarks"] == 0
                good = among and same and no_bench
                ok &= good
                rows.append(f"{name:14} {mode}: {'PASS' if good else 'FAIL'} {k.rpartition(':')[2]} config "
                            f"{ran['config']} among JIT's {len(j['considered'].get(k, []))}: {among}; output == JIT "
                            f"with it: {same}; benchmarks {case['benchmarks']}")
    for side, label in ((a, "a"), (bb, "b")):
        if side["compiles"]:
            ok = False
            rows.append(f"{label}: FAIL {len(side['compiles'])} Triton compiles")
        rows.append(f"{label}: policy {side['policy']}; {side['note']}")
    print("\n".join(rows))
    print(f"JIT side: {jit['compiles']} Triton compiles from an empty cache")
    print("AUTOTUNE:", "PASS" if ok else "FAIL")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ok": ok, "rows": rows, "plan": plan, "tune": tuned, "a": a, "b": bb, "jit": jit}, f)
    return 0 if ok else 1


def list_sources(vllm_src: str) -> int:
    """The vLLM files (relative to vllm/) the driven modules import, as check_call_sites.py --list-sources prints."""
    import torch  # noqa: F401
    import triton  # noqa: F401
    from vllm_mount import mount

    finder = mount(vllm_src)
    _import()
    print(json.dumps({"files": sorted(set(finder.loaded))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
