"""The `nojit` command: build, inspect and check bundles.

Errors from nojit print as one message with its fix and exit 2; nothing prints a traceback
unless NOJIT_DEBUG=1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from nojit.loader.errors import NoJitError


def _runtimes(args: argparse.Namespace) -> frozenset[str]:
    """--runtime, or every registered runtime: each model's room decides what a runtime plans for it (Qwen3.5's GDN
    prefill needs flashinfer_cute, DeepSeek-V4 plans nothing there), so a default build misses none. A name nojit
    does not know is an error (a typo would silently build a bundle without that runtime)."""
    from nojit.aot.errors import BuildError
    from nojit.aot.runtimes import RUNTIMES, runtime

    if args.runtime is None:
        return frozenset(RUNTIMES)
    names = frozenset(n.strip() for n in args.runtime.split(",") if n.strip())
    if not names:
        raise BuildError(f"--runtime {args.runtime!r} names no runtime",
                         fix=f"give a comma list of {', '.join(RUNTIMES)}, or leave --runtime out for all of them")
    for name in sorted(names):
        runtime(name)  # BuildError naming the known ones
    return names


def _build(args: argparse.Namespace) -> int:
    from nojit.aot.build import BuildOptions, build
    from nojit.aot.deployment import DEFAULT_DEPLOYMENT, default_deployment_text, load_deployment
    from nojit.aot.report import summary
    from nojit.loader.bundle.file import Bundle

    if args.print_default_deployment:
        sys.stdout.write(default_deployment_text())
        return 0
    if args.deployment and len(args.deployment) > 1:
        return _build_many(args)
    args.deployment = args.deployment[0] if args.deployment else None
    deployment = None if args.from_plan else load_deployment(args.deployment or DEFAULT_DEPLOYMENT)
    output = args.output or os.path.join("out", f"{deployment.name if deployment else 'bundle'}.nojit")
    opts = BuildOptions(
        output=output,
        deployment=deployment,
        groups=set(args.groups.split(",")) if args.groups else None,
        kernels=args.kernels.split(",") if args.kernels else None,
        runtimes=_runtimes(args),
        jobs=args.jobs,
        add_keys=args.add_keys or [],
        plan_in=args.from_plan,
        plan_out=args.emit_plan,
        kernel_sources=args.kernel_sources,
        merge=args.merge or [],
        generic=args.generic,
        progress=not args.quiet,
        plan_only=args.plan_only,
        ray=args.ray,
    )
    if args.cache_dir:
        opts.cache_dir = args.cache_dir
    if args.plan_only and not args.emit_plan:
        print("nojit: error: --plan-only needs --emit-plan FILE", file=sys.stderr)
        return 2
    result = _quietly(args, output, lambda: build(opts), opts)
    if args.plan_only:
        print(f"plan: {len(result.plan.requests)} requests of {len(result.plan.kernels)} kernels -> {args.emit_plan} "
              f"({result.seconds['plan']:.1f}s)")
        return 0
    print(summary(Bundle.open(output)))
    s = result.seconds
    print(f"\nbuild time: plan {s['plan']:.1f}s, compile {s['compile']:.1f}s ({opts.jobs} jobs), "
          f"write {s['write']:.1f}s, total {s['total']:.1f}s")
    return 0


def _quietly(args: argparse.Namespace, output: str, run: Any, opts: Any) -> Any:
    """Run the build with the libraries' output in a build log (build_log.py) unless --verbose."""
    from nojit.aot.build_log import default_log_path, quiet

    log_path = None if args.verbose else (args.build_log or default_log_path(output))
    if log_path:
        print(f"build log: {log_path} (what vLLM, torch, the compilers and the workers print; --verbose shows it "
              "here)", flush=True)
    try:
        with quiet(log_path) as terminal:
            opts.terminal = terminal
            return run()
    except NoJitError as exc:
        if log_path:
            exc.fix = f"{exc.fix} (the libraries' output: {log_path})"
        raise


def _tune(args: argparse.Namespace) -> int:
    from nojit.aot.tune import tune

    result = tune(args.bundle, args.output)
    for kid, keys in sorted(result.winners.items()):
        for key, winner in keys.items():
            times = result.timings[kid][key]
            print(f"{kid} {key!r}: config {winner} of {sorted(times)} "
                  f"({_ms(times[winner])} ms; slowest {_ms(max(times.values()))} ms)")
    for line in result.skipped:
        print(f"not tuned: {line}")
    n = sum(len(k) for k in result.winners.values())
    print(f"{n} tuning keys tuned; wrote {result.output}")
    return 0


def _ms(t: Any) -> str:
    return f"{(t[0] if isinstance(t, (list, tuple)) else t):.4f}"


def _build_many(args: argparse.Namespace) -> int:
    """Several --deployment files: one bundle each in -o DIR, common compiles done once (multi_build.py)."""
    from nojit.aot.build import BuildOptions
    from nojit.aot.multi_build import build_many

    if args.from_plan or args.emit_plan or args.merge or args.kernel_sources:
        print("nojit: error: several --deployment files take no --from-plan, --emit-plan, --merge or "
              "--kernel-sources", file=sys.stderr)
        return 2
    opts = BuildOptions(output="", groups=set(args.groups.split(",")) if args.groups else None,
                        kernels=args.kernels.split(",") if args.kernels else None,
                        runtimes=_runtimes(args), jobs=args.jobs, add_keys=args.add_keys or [],
                        generic=args.generic, progress=not args.quiet, ray=args.ray)
    if args.cache_dir:
        opts.cache_dir = args.cache_dir
    result = _quietly(args, os.path.join(args.output or "out", "bundles"),
                      lambda: build_many(args.deployment, args.output or "out", opts), opts)
    s = result["seconds"]
    print("\n".join(result["outputs"]))
    print(f"{len(result['outputs'])} bundles, {result['requests']} requests, {result['compiled']} distinct compiles; "
          f"plan {s['plan']:.1f}s, compile {s['compile']:.1f}s ({opts.jobs} jobs), write {s['write']:.1f}s, "
          f"total {s['total']:.1f}s")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from nojit.aot.report import summary
    from nojit.loader.bundle.file import Bundle

    bundle = Bundle.open(args.bundle)
    if args.verify:
        n = bundle.verify()
        print(f"verified {len(bundle.index.sections)} kernel sections (schema) and {n} cubins: every sha256 matches")
    if args.json:
        import json

        print(json.dumps(bundle.manifest.to_json(), indent=1, sort_keys=True))
    else:
        print(summary(bundle, keys=args.keys))
    return 0


def _coverage(args: argparse.Namespace) -> int:
    from nojit.aot import coverage
    from nojit.aot.build import BuildOptions, add_recorded_keys, plan_deployment
    from nojit.aot.bundle_writer import write_text_atomically
    from nojit.aot.deployment import DEFAULT_DEPLOYMENT, load_deployment
    from nojit.aot.plan import Plan
    from nojit.loader.bundle.file import Bundle

    bundle = Bundle.open(args.bundle)
    if args.plan:
        plan = Plan.read(args.plan)
    else:
        deployment = load_deployment(args.deployment or DEFAULT_DEPLOYMENT)
        plan = plan_deployment(BuildOptions(output="", deployment=deployment))
    if args.add_keys:
        add_recorded_keys(plan, args.add_keys)
    rows = coverage.compute(plan, bundle)
    print(coverage.render_table(rows))
    observed_ok = True
    if args.observed:
        from nojit.aot.observed_coverage import report

        text, observed_ok = report(args.observed, plan, bundle)
        print(text)
    if args.html:
        write_text_atomically(args.html, coverage.render_html(rows, bundle, plan.deployment))
        print(f"\nHTML report: {args.html}")
    total = coverage.totals(rows)
    return 0 if (args.fail_under is None or total["percent"] >= args.fail_under) and observed_ok else 1


def _package(args: argparse.Namespace) -> int:
    from nojit.aot.package import describe, package_bundle

    print(describe(package_bundle(args.bundle, args.output, args.version)))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from nojit.loader.doctor import main as doctor_main  # loader-side: a serving machine needs no build deps

    return doctor_main(args.bundle, args.json)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nojit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="build a bundle for a deployment")
    b.add_argument("--deployment", action="append", help="deployment TOML (default: the built-in DeepSeek-V4-Flash H200 "
                   "deployment); repeat it to build one bundle per deployment into -o DIR, sharing common compiles")
    b.add_argument("-o", "--output", help="bundle path (default: out/<deployment name>.nojit); a directory with "
                   "several --deployment")
    b.add_argument("--ray", metavar="ADDRESS", help="compile on this Ray cluster (auto, ray://host:port); needs nojit[ray]")
    b.add_argument("--groups", help="comma-separated kernel groups to build (default: all the deployment reaches)")
    b.add_argument("--kernels", help="comma-separated substrings: build only kernels whose id contains one")
    b.add_argument("--runtime", help="comma list of triton, tilelang, cutedsl, flashinfer_cute, deepgemm, flashinfer, "
                   "humming (default: all; without deepgemm and flashinfer the build runs no nvcc; humming compiles "
                   "with NVRTC)")
    b.add_argument("-j", "--jobs", type=int, default=max(1, os.cpu_count() or 1), help="compile workers")
    b.add_argument("--add-keys", action="append", metavar="FILE", help="merge keys recorded with NOJIT_MODE=record")
    b.add_argument("--emit-plan", metavar="FILE", help="also write the compile plan as JSON")
    b.add_argument("--plan-only", action="store_true", help="with --emit-plan: write the plan and stop (no compiling)")
    b.add_argument("--from-plan", metavar="FILE", help="compile a plan written by --emit-plan (no vLLM needed)")
    b.add_argument("--kernel-sources", metavar="FILE", help="with --from-plan: JSON map of kernel id to source file")
    b.add_argument("--merge", action="append", metavar="BUNDLE", help="take the entries of another bundle too")
    b.add_argument("--generic", action=argparse.BooleanOptionalAction, default=True,
                   help="add generic entries per constexpr/dtype combination (default: on)")
    b.add_argument("--cache-dir", help="compile cache (default: ~/.cache/nojit)")
    b.add_argument("--quiet", action="store_true", help="no plan line and no progress bar")
    b.add_argument("--verbose", action="store_true", help="show what the libraries and workers print (default: "
                   "it goes to the build log)")
    b.add_argument("--build-log", metavar="FILE", help="where that output goes (default: next to the bundle, "
                   "<name>.build.log)")
    b.add_argument("--print-default-deployment", action="store_true", help="print the built-in deployment TOML")
    b.set_defaults(func=_build)

    i = sub.add_parser("inspect", help="show what a bundle holds")
    i.add_argument("bundle")
    i.add_argument("--keys", action="store_true", help="list every entry's key")
    i.add_argument("--verify", action="store_true", help="read every cubin and check its sha256")
    i.add_argument("--json", action="store_true", help="print the manifest as JSON")
    i.set_defaults(func=_inspect)

    c = sub.add_parser("coverage", help="compare a bundle with a deployment's reachable keys")
    c.add_argument("bundle")
    c.add_argument("--deployment", help="deployment TOML (default: the built-in one); needs vLLM installed")
    c.add_argument("--plan", help="a plan from `nojit build --emit-plan` instead of planning the deployment")
    c.add_argument("--add-keys", action="append", metavar="FILE", help="count keys recorded with NOJIT_MODE=record")
    c.add_argument("--observed", metavar="FILE", help="keys observed on real steps (JSONL, NOJIT_MODE=record "
                   "format): shown against the plan and the bundle; exit 1 if one is unplanned or missing")
    c.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    c.add_argument("--fail-under", type=float, metavar="PERCENT", help="exit 1 if coverage is below PERCENT")
    c.set_defaults(func=_coverage)

    w = sub.add_parser("package", help="make a pip-installable bundle wheel, pinned to the bundle's versions")
    w.add_argument("bundle")
    w.add_argument("-o", "--output", default="dist", help="directory for the wheel (default: dist)")
    w.add_argument("--version", help="wheel version (default: <nojit version>+<first 12 hex of the bundle sha256>)")
    w.set_defaults(func=_package)

    t = sub.add_parser("tune", help="on the serving GPU: time each tuning key's configs with the bundle's cubins "
                       "and write a bundle with the winners (served with no benchmark)")
    t.add_argument("bundle")
    t.add_argument("-o", "--output", help="the tuned bundle (default: BUNDLE with .tuned.nojit)")
    t.set_defaults(func=_tune)

    d = sub.add_parser("doctor", help="check, without starting vLLM, whether a bundle will serve on this machine")
    d.add_argument("bundle", nargs="?", help="the bundle (default: NOJIT_BUNDLE, else the installed bundle wheel)")
    d.add_argument("--json", action="store_true", help="the findings as JSON")
    d.set_defaults(func=_doctor)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return args.func(args)
    except NoJitError as exc:
        if os.environ.get("NOJIT_DEBUG") == "1":
            raise
        print(f"nojit: error: {exc.message}\n  fix: {exc.fix}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nojit: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
