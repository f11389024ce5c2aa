"""Files no process of the strict tree can read: Landlock's "everything except these files", as rules can say it.

Strict mode makes two kinds of file unreadable (landlock.py applies the rules): NVRTC's builtins library
(nvrtc_builtins.py: NVRTC opens it only to compile) and every compiler the exec allow-list refuses (compilers.py).
Refusing to execute a compiler is not enough on its own: the dynamic loader run on it (`ld-linux-x86-64.so.2
/usr/bin/gcc`) maps it as a library, which Landlock does not check, and its bytes copied into a `memfd` (a file
Landlock never checks) or written after install into a folder with an exec rule run too. All three need to read the
compiler first; the kernel checks that read, here and in every child.

Landlock rules only allow, so "everything except X" is one rule per entry of each folder above X other than the
path down to X (a folder's rule covers its tree). What that costs: a file or folder created after install directly
in one of those folders (not below one of its entries) cannot be read by the process tree. So a file is left
readable (and said so) when a folder above it is one where a serving process creates things: the working folder,
the home folder, the temporary folder.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable


def busy_folders() -> set[str]:
    """Folders where a serving process creates entries of its own: a file below them is left readable. Never "/"
    (a service's default working folder, and a home of some system users): every file is below it, so it would
    leave every compiler readable, while a server creating entries directly in "/" is rare (they would be unreadable
    to the tree)."""
    busy = {os.getcwd(), os.path.expanduser("~"), tempfile.gettempdir()}
    return {os.path.realpath(b) for b in busy if b} - {os.sep}


def _above(path: str) -> list[str]:
    out = []
    d = os.path.dirname(path)
    while True:
        out.append(d)
        if d == os.sep:
            return out
        d = os.path.dirname(d)


def read_rules(files: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """(paths that get a read rule, files made unreadable, files left readable with why), for real paths."""
    busy = busy_folders()
    denied, kept = [], []
    for c in dict.fromkeys(files):
        near = [d for d in _above(c) if d in busy]
        if near:
            kept.append(f"{c} (below {near[0]}, where files are created while serving)")
        else:
            denied.append(c)
    if not denied:
        return [], [], kept
    ancestors = {d for c in denied for d in _above(c)}
    out_of_rules = ancestors | set(denied)
    rules = []
    for folder in sorted(ancestors):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            if e.path in out_of_rules or e.is_symlink():  # a link is read where it points, under that path's rules
                continue
            rules.append(e.path)
    return rules, denied, kept
