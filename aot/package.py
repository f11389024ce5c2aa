"""`nojit package`: a bundle as a pip-installable wheel, pinned to the versions that built it.

The wheel is written with the standard library only (no setuptools, no compiler): a zip
with fixed timestamps, sorted members and fixed permissions, so the same bundle always
gives the same wheel bytes. It holds one package, `nojit_bundle_<name>`, with the bundle
file and `bundle.json` (file name and sha256), declared in the `nojit.bundles` entry-point
group that nojit.loader.bundle.installed reads. Requires-Dist pins the exact nojit, vLLM
and Triton of the bundle's manifest, so pip refuses to put the bundle next to other ones;
TileLang is pinned through the `tilelang` extra only, because serving needs no TileLang
(if one is installed, the loader refuses a different version anyway).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import tempfile
import zipfile

from nojit.loader.bundle.file import Bundle
from nojit.aot.errors import BuildError
from nojit.loader.bundle.installed import BUNDLE_INFO, ENTRY_POINT_GROUP, file_sha256

ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest zip timestamp: no build time leaks into the wheel
GENERATOR = "nojit package"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def bundle_names(bundle: Bundle) -> tuple[str, str]:
    """(distribution name, package name), e.g. nojit-bundle-deepseek-v4-flash-sm90, nojit_bundle_deepseek_v4_flash_sm90."""
    deployment = bundle.manifest.deployment.get("name") or os.path.splitext(os.path.basename(bundle.path))[0]
    arch = f"sm{bundle.manifest.target.capability}"
    package = f"nojit_bundle_{_slug(str(deployment))}_{arch}"
    return package.replace("_", "-"), package


def requirements(bundle: Bundle) -> list[str]:
    """Requires-Dist lines: the producer versions the loader's version rule will insist on."""
    p = bundle.manifest.producer
    runtimes = {k.runtime for k in bundle.manifest.kernels.values()}
    reqs = [f"nojit=={p.nojit}"]
    if p.vllm:
        reqs.append(f"vllm=={p.vllm}")
    if p.triton and "triton" in runtimes:
        reqs.append(f"triton=={p.triton}")
    if p.tilelang and "tilelang" in runtimes:
        reqs.append(f'tilelang=={p.tilelang}; extra == "tilelang"')
    return reqs


def _metadata(dist: str, version: str, bundle: Bundle, sha: str) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {dist}", f"Version: {version}",
             f"Summary: nojit kernel bundle {os.path.basename(bundle.path)} (sha256 {sha})"]
    if any(k.runtime == "tilelang" for k in bundle.manifest.kernels.values()) and bundle.manifest.producer.tilelang:
        lines.append("Provides-Extra: tilelang")
    lines += [f"Requires-Dist: {r}" for r in requirements(bundle)]
    return "\n".join(lines) + "\n"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _zip_info(name: str, stored: bool) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
    info.external_attr = 0o100644 << 16
    info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    info.create_system = 3  # unix, whatever machine builds it
    return info


def package_bundle(bundle_path: str, out_dir: str, version: str | None = None) -> str:
    """Write the bundle wheel into out_dir (atomically) and return its path."""
    bundle = Bundle.open(bundle_path)  # a damaged bundle fails here, before anything is written
    sha = file_sha256(bundle_path)
    dist, package = bundle_names(bundle)
    version = version or f"{bundle.manifest.producer.nojit}+{sha[:12]}"
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*([a-z0-9.]*)(\+[a-z0-9.]+)?", version):
        raise BuildError(f"wheel version {version!r} is not a simple PEP 440 version", fix="pass e.g. --version 1.0.0")
    file_name = os.path.basename(bundle_path)
    with open(bundle_path, "rb") as f:
        bundle_bytes = f.read()
    info = json.dumps({"file": file_name, "sha256": sha}, indent=1, sort_keys=True).encode() + b"\n"
    init = (f'"""nojit bundle {file_name} (sha256 {sha}); found by nojit.loader.bundle.installed."""\n').encode()
    dist_info = f"{package}-{version}.dist-info"
    members: list[tuple[str, bytes, bool]] = [
        (f"{package}/__init__.py", init, False),
        (f"{package}/{BUNDLE_INFO}", info, False),
        (f"{package}/{file_name}", bundle_bytes, True),  # already zstandard-compressed: stored
        (f"{dist_info}/METADATA", _metadata(dist, version, bundle, sha).encode(), False),
        (f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: true\n"
                               "Tag: py3-none-any\n".encode(), False),
        (f"{dist_info}/entry_points.txt", f"[{ENTRY_POINT_GROUP}]\n{package} = {package}\n".encode(), False),
        (f"{dist_info}/top_level.txt", f"{package}\n".encode(), False),
    ]
    members.sort(key=lambda m: m[0])
    record = "\n".join([_record_line(n, d) for n, d, _ in members] + [f"{dist_info}/RECORD,,"]) + "\n"
    members.append((f"{dist_info}/RECORD", record.encode(), False))

    os.makedirs(out_dir, exist_ok=True)
    wheel_path = os.path.join(out_dir, f"{package}-{version}-py3-none-any.whl")
    fd, tmp = tempfile.mkstemp(prefix=".nojit-", suffix=".whl.partial", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w") as zf:
            for name, data, stored in members:
                zf.writestr(_zip_info(name, stored), data, compresslevel=None if stored else 9)
        os.replace(tmp, wheel_path)
    except BaseException:
        os.unlink(tmp)
        raise
    return wheel_path


def describe(wheel_path: str) -> str:
    """One line per fact an operator checks before copying the wheel into an image."""
    with zipfile.ZipFile(wheel_path) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    pins = [line.removeprefix("Requires-Dist: ") for line in lines if line.startswith("Requires-Dist: ")]
    size = os.path.getsize(wheel_path)
    return f"{wheel_path} ({size / 1e6:.1f} MB)\n  requires: " + "\n            ".join(pins)

