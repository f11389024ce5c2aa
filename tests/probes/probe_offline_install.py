"""Run by test_offline_install.py with the python of a fresh virtual environment into which the
nojit wheel and a bundle wheel were installed offline, on a PATH with no compiler.

It checks that no compiler is reachable, that nojit comes from that environment (not the
source tree), that the loader finds the installed bundle with no configuration and checks
its sha256, then installs it in strict mode and resolves every key of the build plan to a
bundled cubin (the launch itself needs a GPU: tests/gpu/device_run.sh step `wheel`). Prints
one JSON report line.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "nvcc", "ptxas")


def main(plan_path: str) -> int:
    report: dict = {"compilers_on_path": {c: shutil.which(c) for c in COMPILERS}}
    assert not any(report["compilers_on_path"].values()), report
    assert "NOJIT_BUNDLE" not in os.environ

    import nojit.loader.install as install_mod
    from nojit.loader.strict import guards
    from nojit.loader.bundle import installed as installed_bundles
    from nojit.loader.bundle.triton_key import key_from_json

    report["nojit_from"] = install_mod.__file__
    assert install_mod.__file__.startswith(sys.prefix), report  # the installed wheel, not the source tree
    import nojit.loader._cuda_launcher as c_launcher  # the abi3 launcher the wheel carries

    report["launcher"] = c_launcher.__file__
    found = installed_bundles.verified_installed_bundle()
    assert found is not None and found.path.startswith(sys.prefix), found
    report["bundle"] = {"distribution": found.distribution, "path": found.path, "sha256": found.sha256}

    inst = install_mod.install(mode="strict")  # no path: the installed bundle wheel
    assert inst.bundle.path == found.path
    report["verified_cubins"] = inst.bundle.verify()
    with open(plan_path) as f:
        plan = json.load(f)
    resolved = {"exact": 0, "generic": 0}
    for request in plan["requests"]:
        server = inst.servers("triton")[request["kernel"]]
        key = key_from_json(request["key"])
        table = server.exact if request["variant"] == "exact" else server.generic
        variant = table.get(key)
        assert variant is not None, f"{request['kernel']} {request['variant']} key not resolved"
        assert variant.entry.blob in inst.bundle.manifest.blobs
        resolved[request["variant"]] += 1
    report["resolved"] = resolved
    report["compile_attempts"] = len(guards.compile_attempts)
    assert not guards.compile_attempts
    inst.uninstall()

    # a damaged installed bundle is refused before it is parsed
    with open(found.path, "ab") as f:
        f.write(b"\0")
    try:
        installed_bundles.verified_installed_bundle()
    except installed_bundles.BundleCorruptError as exc:
        report["tampered"] = exc.message
    else:
        raise AssertionError("a modified installed bundle was accepted")
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
