"""Bundles installed as wheels: found through the `nojit.bundles` entry point, checked by sha256.

`nojit package` makes a bundle wheel whose package holds the bundle file and a small
`bundle.json` ({"file": ..., "sha256": ...}) and declares itself in the `nojit.bundles`
entry-point group, as FlashInfer finds flashinfer-cubin: installing the wheel is all the
configuration a serving image needs. Nothing of the wheel is imported (its package is only
located), and the file's sha256 is checked against the recorded one before the bundle is
parsed. NOJIT_BUNDLE still wins over an installed wheel.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
from dataclasses import dataclass

from nojit.loader.errors import BundleCorruptError, BundleError

ENTRY_POINT_GROUP = "nojit.bundles"
BUNDLE_INFO = "bundle.json"  # inside the bundle wheel's package: {"file": name, "sha256": hex}


@dataclass(frozen=True)
class InstalledBundle:
    """One installed bundle wheel: its distribution, the bundle file's path and recorded sha256."""

    distribution: str
    path: str
    sha256: str


def _package_dir(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def installed_bundles() -> list[InstalledBundle]:
    """Every bundle wheel installed in this environment, sorted by distribution name."""
    found = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else ep.name
        where = _package_dir(ep.value)
        info_path = os.path.join(where, BUNDLE_INFO) if where else None
        if info_path is None or not os.path.isfile(info_path):
            raise BundleError(f"bundle wheel {dist}: package {ep.value} has no {BUNDLE_INFO}",
                              fix=f"reinstall it (`pip install --force-reinstall {dist}`) or rebuild it with `nojit package`")
        try:
            with open(info_path) as f:
                info = json.load(f)
            name, sha = info["file"], info["sha256"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BundleCorruptError(f"bundle wheel {dist}: {info_path} is unreadable ({exc})",
                                     fix=f"reinstall it (`pip install --force-reinstall {dist}`)") from None
        found.append(InstalledBundle(dist, os.path.join(where, os.path.basename(name)), sha))
    return sorted(found, key=lambda b: b.distribution)


def file_sha256(path: str) -> str:
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


def verified_installed_bundle() -> InstalledBundle | None:
    """default_installed_bundle(), after checking its file against the sha256 the wheel recorded."""
    bundle = default_installed_bundle()
    if bundle is None:
        return None
    try:
        actual = file_sha256(bundle.path)
    except OSError as exc:
        raise BundleError(f"bundle wheel {bundle.distribution}: cannot read {bundle.path} ({exc.strerror})",
                          fix=f"reinstall it (`pip install --force-reinstall {bundle.distribution}`)") from None
    if actual != bundle.sha256:
        raise BundleCorruptError(
            f"bundle wheel {bundle.distribution}: {bundle.path} has sha256 {actual[:16]}..., "
            f"the wheel recorded {bundle.sha256[:16]}... (the file was modified or damaged)",
            fix=f"reinstall it (`pip install --force-reinstall {bundle.distribution}`)",
        )
    return bundle
