"""Where an installed package is, as the import system would find it, without importing it.

One place for a question three parts of the loader ask: where a bundle wheel's package is (installed_bundles),
which dist-info a tool's version is read from (versions), and whether a module a bundle names is a file of the
installed vLLM (resolve).
"""

from __future__ import annotations

import importlib.util
import os


def package_dirs(name: str) -> tuple[str, ...]:
    """The folders the importable package `name` loads its submodules from (empty: not found, or a plain module).
    A top-level name is located, not imported; a dotted name imports its parent packages (the import system's rule)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    return tuple(spec.submodule_search_locations)


_listings: dict[str, list[str]] = {}


def dist_info_dir(package: str) -> str | None:
    """The one `<package>-*.dist-info` folder next to the importable package (None: not found, or several).
    Each site folder is listed once per process (site-packages can hold thousands of entries)."""
    dirs = package_dirs(package)
    if not dirs:
        return None
    site = os.path.dirname(dirs[0])
    names = _listings.get(site)
    if names is None:
        try:
            names = _listings[site] = [n for n in os.listdir(site) if n.endswith(".dist-info")]
        except OSError:
            return None
    prefix = f"{package}-"
    found = [n for n in names if n.startswith(prefix) and n[len(prefix):len(prefix) + 1].isdigit()]
    return os.path.join(site, found[0]) if len(found) == 1 else None
