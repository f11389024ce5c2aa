"""Bundles installed as wheels: found through the `nojit.bundles` entry point, checked by sha256.

`nojit package` makes a bundle wheel whose package holds the bundle file and a small
`bundle.json` ({"file": ..., "sha256": ...}) and declares itself in the `nojit.bundles`
entry-point group, as FlashInfer finds flashinfer-cubin: installing the wheel is all the
configuration a serving image needs. Nothing of the wheel is imported (its package is only
located), and the file's sha256 is checked against the recorded one before the bundle is
parsed, by Bundle.open on the descriptor it then parses (`open_installed_bundle`). NOJIT_BUNDLE
still wins over an installed wheel.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import stat
from dataclasses import dataclass

from nojit.loader.bundle.file import Bundle, Pin
from nojit.loader.errors import BundleCorruptError, BundleError, BundleMismatchError
from nojit.loader.packages import package_dirs

ENTRY_POINT_GROUP = "nojit.bundles"
BUNDLE_INFO = "bundle.json"  # inside the bundle wheel's package: {"file": name, "sha256": hex}
_MAX_INFO_BYTES = 64 << 10


@dataclass(frozen=True)
class InstalledBundle:
    """One installed bundle wheel: its distribution, the bundle file's path and recorded sha256."""

    distribution: str
    path: str
    sha256: str


def installed_bundles() -> list[InstalledBundle]:
    """Every bundle wheel installed in this environment, sorted by distribution name."""
    found = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else ep.name
        where = next(iter(package_dirs(ep.value)), None)
        info_path = os.path.join(where, BUNDLE_INFO) if where else None
        if info_path is None or not os.path.isfile(info_path):
            raise BundleError(f"bundle wheel {dist}: package {ep.value} has no {BUNDLE_INFO}",
                              fix=f"reinstall it (`pip install --force-reinstall {dist}`) or rebuild it with `nojit package`")
        name, sha = _read_info(info_path, dist)
        found.append(InstalledBundle(dist, os.path.join(where, name), sha))
    return sorted(found, key=lambda b: b.distribution)


def _read_info(info_path: str, dist: str) -> tuple[str, str]:
    """bundle.json's file name and sha256, each type-checked: a plain file name in the package folder and 64 hex
    digits (a number, a list or a path there is damage, a BundleCorruptError naming the wheel and the field)."""
    fix = f"reinstall it (`pip install --force-reinstall {dist}`) or rebuild it with `nojit package`"
    try:
        fd = os.open(info_path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise BundleCorruptError(f"bundle wheel {dist}: {info_path} is not a regular file", fix=fix)
            raw = os.read(fd, _MAX_INFO_BYTES + 1)
        finally:
            os.close(fd)
        if len(raw) > _MAX_INFO_BYTES:
            raise BundleCorruptError(f"bundle wheel {dist}: {info_path} is over {_MAX_INFO_BYTES} bytes", fix=fix)
        info = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleCorruptError(f"bundle wheel {dist}: {info_path} is unreadable ({type(exc).__name__})", fix=fix) from None
    if not isinstance(info, dict):
        raise BundleCorruptError(f"bundle wheel {dist}: {info_path} is a JSON {type(info).__name__}, not an object",
                                 fix=fix)
    name, sha = info.get("file"), info.get("sha256")
    if not isinstance(name, str) or name in ("", ".", "..") or name != os.path.basename(name) or "\0" in name:
        raise BundleCorruptError(f"bundle wheel {dist}: {info_path} field 'file' is {name!r:.80}, "
                                 "not the bundle's file name", fix=fix)
    if not isinstance(sha, str) or len(sha) != 64 or not set(sha.lower()) <= set("0123456789abcdef"):
        raise BundleCorruptError(f"bundle wheel {dist}: {info_path} field 'sha256' is {sha!r:.80}, "
                                 "not 64 hex digits", fix=fix)
    return name, sha.lower()


def file_sha256(path: str) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks (bundles are tens of MB): the bundle wheel's record, the
    build's compile-cache inputs (aot/compile_cache.py) and the device tools all use this one."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_installed_bundle() -> InstalledBundle | None:
    """The one installed bundle wheel (None if none); more than one is an error: the operator must choose."""
    found = installed_bundles()
    if len(found) > 1:
        names = ", ".join(f"{b.distribution} ({b.path})" for b in found)
        raise BundleError(f"{len(found)} bundle wheels are installed: {names}",
                          fix="uninstall all but one, or set NOJIT_BUNDLE to the bundle file to serve")
    return found[0] if found else None


def open_installed_bundle(env_pin: str | None = None) -> Bundle | None:
    """The one installed bundle wheel's bundle, opened with the sha256 the wheel recorded as its pin (checked on
    the descriptor that is then parsed); None if no bundle wheel is installed. env_pin (NOJIT_BUNDLE_SHA256), if
    set, must name the same digest."""
    if env_pin is not None and not isinstance(env_pin, str):
        raise BundleError(f"env_pin={env_pin!r:.80} is a {type(env_pin).__name__}, not a str",
                          fix="pass NOJIT_BUNDLE_SHA256's 64 hex digits as a string, or None")
    found = default_installed_bundle()
    if found is None:
        return None
    fix = f"reinstall it (`pip install --force-reinstall {found.distribution}`)"
    if env_pin is not None and env_pin.strip().lower() != found.sha256.lower():
        raise BundleMismatchError(f"NOJIT_BUNDLE_SHA256 pins {env_pin.strip()[:16]}..., the installed bundle wheel "
                                  f"{found.distribution} recorded {found.sha256[:16]}...",
                                  fix="unset NOJIT_BUNDLE_SHA256, set it to the wheel's digest, or install the pinned bundle")
    if not os.path.isfile(found.path):
        raise BundleError(f"bundle wheel {found.distribution}: {found.path} is missing", fix=fix)
    return Bundle.open(found.path, pin=Pin(found.sha256, by=f"bundle wheel {found.distribution}", fix=fix, recorded=True))


def verified_installed_bundle() -> InstalledBundle | None:
    """default_installed_bundle(), after checking its file against the sha256 the wheel recorded (tools, tests)."""
    bundle = open_installed_bundle()
    if bundle is None:
        return None
    bundle.close()
    return default_installed_bundle()
