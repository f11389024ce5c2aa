"""A runtime added from outside the package: plan, build, install, preload, announce, the unserved table, a
launch through the dry launcher. Prints one JSON line. usage: scenario.py OUT_BUNDLE

The only lines that tell nojit about the toy runtime are the two registrations below, one per side."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE))]  # the toy rooms, and the repository root (tests.support)

import build_room  # noqa: E402
import serve_room  # noqa: E402
import toy_kernels  # noqa: E402
from tests.support.dry_launcher import install_dry_run  # noqa: E402

from nojit.aot import runtimes as aot_runtimes  # noqa: E402
from nojit.loader import runtimes as loader_runtimes  # noqa: E402


class InlineExecutor:
    """The build's compile tasks in this process (the toy runtime is registered here only)."""

    def run(self, task, args, initializer, initargs):
        initializer(*initargs)
        for a in args:
            yield task(*a)


def main(out: str) -> dict:
    from nojit.aot.build import BuildOptions, build
    from nojit.aot.deployment import load_deployment
    from nojit.loader import announce, unserved
    from nojit.loader.install import install, resolve_object

    report: dict = {}
    with aot_runtimes.registered(build_room.RUNTIME), loader_runtimes.registered(serve_room.RUNTIME):
        result = build(BuildOptions(output=out, deployment=load_deployment(), runtimes=frozenset({"toy"}),
                                    executor=InlineExecutor(), compile_cache=False, progress=False))
        report["planned"] = sorted(json.dumps(r.key) for r in result.plan.requests)
        report["built_entries"] = [e.launch.to_json() for e in result.manifest.entries]
        dry = install_dry_run()
        inst = install(out, mode="strict", resolver=resolve_object)
        report["handles"] = sorted(inst.handles)
        report["preloaded"] = inst.preload(0)
        report["loads_after_preload"] = dry.loads
        toy_kernels.scale(128)
        report["launches"] = [launch["grid"] for launch in dry.launches]
        try:
            toy_kernels.scale(96)
        except Exception as exc:
            report["miss"] = type(exc).__name__
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            announce.announce(inst)
        report["announced"] = err.getvalue().splitlines()
        report["unserved_without_toy"] = unserved.report(frozenset({"triton"}))
        report["served_names"] = unserved.report(frozenset(r.name for r in loader_runtimes.RUNTIMES.values()))
        inst.uninstall()
        try:
            toy_kernels.scale(128)
        except RuntimeError as exc:
            report["after_uninstall"] = str(exc)
    report["registered_after"] = ["toy" in aot_runtimes.RUNTIMES, "toy" in loader_runtimes.RUNTIMES]
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
