"""Which files on this machine are compilers, by what they are, not by what they are called.

Strict mode's execution allow-list (landlock.py) must leave every compiler out, including a copy
or a link under another name. A compiler is found by name where compilers live (PATH, /usr/bin,
/usr/local/cuda*/bin, /usr/lib/gcc/*/*, libexec, LLVM's bin folders, the Python environments'
bin folders and every `bin`/`_native` folder of their site-packages: nvidia wheels, Triton's
bundled ptxas, Humming's nvrtc_compile); its identity is then (dev, inode) and (size, sha256),
so any other file with the same inode, or the same size and content, is a compiler too. Digests
are computed only when a file's size equals a compiler's (rare: 2 per process here).

Nothing of this is cached in a file: every process finds the compilers by name again (about 0.1 s here, most
of it globbing site-packages). The runtime folder's `compilers.json` (sessions 7-8) was this user's file, trusted as
it was, so a process of the strict tree that rewrote it (a compiler's folder dropped, a digest changed) widened the
next start's allow-list: cc1's folder left out of the list became one whole-tree exec rule
(tests/loader/strict/test_redteam.py). A file of the same user cannot be authenticated against that user.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import stat
import sys
from dataclasses import dataclass, field

# a compiler's file name: optional target prefix, the tool, optional version suffix. The firewall's names
# (firewall._COMPILER_NAME) plus the helpers a driver starts (cc1*, collect2, lto*), LLVM's code generators
# and JIT, and Humming's NVRTC child.
COMPILER_NAME = re.compile(
    r"^(?:[A-Za-z0-9_]+(?:-[A-Za-z0-9_.]+)*?-)?"
    r"(gcc|g\+\+|cc|c\+\+|cpp|clang|clang\+\+|clang-cl|nvcc|ptxas|cicc|nvlink|fatbinary|cudafe\+\+|ninja|"
    r"ld(?:\.gold|\.bfd|\.lld|64\.lld)?|lld|as|cuobjdump|nvdisasm|cc1|cc1plus|cc1obj|cc1objplus|collect2|lto1|"
    r"lto-wrapper|lto-dump|gfortran|f951|tcc|llc|lli|llvm-mc|llvm-lto2?|llvm-jitlink|nvrtc_compile)"
    r"(?:-blackwell)?(?:-[0-9]+(?:\.[0-9]+)*)?$"
)

_SYSTEM_GLOBS = ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/bin", "/sbin",
                 "/usr/local/cuda*/bin", "/usr/local/cuda*/nvvm/bin", "/usr/lib/gcc/*/*", "/usr/lib/gcc-cross/*/*",
                 "/usr/libexec/gcc/*/*", "/usr/lib/llvm-*/bin", "/usr/lib/ccache", "/opt/*/bin")
_SITE_GLOBS = ("*/bin", "*/*/bin", "*/*/*/bin", "*/*/nvvm/bin", "*/*/*/nvvm/bin", "*/_native/*")
CACHE_VERSION = 2  # 2: compilers.json no longer written or read


def is_compiler_name(name: str) -> bool:
    return COMPILER_NAME.match(os.path.basename(name)) is not None


def site_packages() -> list[str]:
    """The site-packages folders of this Python environment (and of the interpreter it was made from)."""
    found = []
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        found += glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages"))
        found += glob.glob(os.path.join(prefix, "lib", "python3*", "dist-packages"))
    return list(dict.fromkeys(os.path.realpath(p) for p in found))


def _site_folders(site: str) -> list[str]:
    """The folders of `site` that _SITE_GLOBS name, in one walk: each folder down to the third level is listed
    once (five glob passes listed the tree five times, most of a first strict start's time; the same folders,
    tests/loader/strict/test_compilers_scan.py)."""
    def dirs(path: str) -> list[str]:  # glob's `*`: every entry not starting with ".", a folder (links followed)
        try:
            with os.scandir(path) as it:
                return [e.path for e in it if not e.name.startswith(".") and _is_dir(e)]
        except OSError:
            return []

    found: dict[str, list[str]] = {pattern: [] for pattern in _SITE_GLOBS}
    for a in dirs(site):
        for b in dirs(a):
            below = dirs(b)
            base = b.rpartition("/")[2]
            if base == "bin":
                found["*/bin"].append(b)
            elif base == "_native":
                found["*/_native/*"] += below
            for c in below:
                name = c.rpartition("/")[2]
                if name == "bin":
                    found["*/*/bin"].append(c)
                if _isdir(c + "/bin"):
                    found["*/*/*/bin"].append(c + "/bin")
                    if name == "nvvm":
                        found["*/*/nvvm/bin"].append(c + "/bin")
                if _isdir(c + "/nvvm/bin"):
                    found["*/*/*/nvvm/bin"].append(c + "/nvvm/bin")
    return list(dict.fromkeys(p for pattern in _SITE_GLOBS for p in found[pattern]))


def _isdir(path: str) -> bool:
    """os.path.isdir without its wrapper: called twice per third-level folder of every site-packages."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _site_signature(site: str) -> list:
    """What changes when a package is installed, upgraded or removed: the top-level entries' inodes and mtimes."""
    sig = []
    try:
        with os.scandir(site) as it:
            for e in it:
                try:
                    s = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                sig.append((e.name, s.st_ino, s.st_mtime_ns))
    except OSError:
        return []
    return sorted(sig)


def search_folders() -> list[str]:
    """The folders compilers are looked for in by name (site-packages folders are added by `find`)."""
    folders = [p for pattern in _SYSTEM_GLOBS for p in glob.glob(pattern)]
    folders += [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(sys.executable)))):
        folders.append(os.path.join(prefix, "bin"))
    real = []
    for p in folders:
        r = os.path.realpath(p)
        if os.path.isdir(r) and "/nojit-" not in r and "/stand-ins-" not in r:  # never our own stand-ins
            real.append(r)
    return list(dict.fromkeys(real))


@dataclass
class Compilers:
    """Every compiler found: path -> (dev, inode, size, mtime_ns); digests filled in on demand."""

    files: dict[str, tuple[int, int, int, int]]
    folders: list[str]  # every folder a compiler was found in (real paths)
    digests: dict[str, str] = field(default_factory=dict)  # path -> sha256, computed lazily
    hashed: int = 0  # digests computed by this process

    def __post_init__(self) -> None:
        self.inodes = {(d, i) for d, i, _, _ in self.files.values()}
        self.sizes: dict[int, list[str]] = {}
        for path, (_, _, size, _) in self.files.items():
            self.sizes.setdefault(size, []).append(path)

    def is_compiler(self, path: str, st: os.stat_result | None = None) -> bool:
        """Whether the file at `path` (a real path) is a compiler: by name, by inode, or by size and content."""
        if is_compiler_name(path):
            return True
        st = st or os.stat(path)
        if (st.st_dev, st.st_ino) in self.inodes:
            return True
        same_size = self.sizes.get(st.st_size)
        if not same_size or not stat.S_ISREG(st.st_mode):
            return False
        digest = _sha256(path)
        # a compiler this process cannot read (made unreadable by an enclosing strict tree) counts as equal
        return digest is not None and any(self.digest_of(p) in (digest, None) for p in same_size)

    def digest_of(self, path: str) -> str | None:
        if path not in self.digests:
            d = _sha256(path)
            if d is None:
                return None
            self.digests[path] = d
            self.hashed += 1
        return self.digests[path]


def _sha256(path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def _scan(folders: list[str]) -> dict[str, tuple[int, int, int, int]]:
    files: dict[str, tuple[int, int, int, int]] = {}
    for folder in folders:
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for name in entries:
            if not COMPILER_NAME.match(name):
                continue
            real = os.path.realpath(os.path.join(folder, name))  # a link's target is the compiler (and is listed)
            try:
                s = os.stat(real)
            except OSError:
                continue
            if stat.S_ISREG(s.st_mode):
                files[real] = (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)
    return files


def _folder_signature(folders: list[str]) -> list:
    sig = []
    for f in folders:
        try:
            s = os.stat(f)
            sig.append((f, s.st_ino, s.st_mtime_ns))
        except OSError:
            sig.append((f, 0, 0))
    return sig


def find() -> Compilers:
    """Every compiler of this machine and Python environment, found by name now (never read from a cache).
    `cache_key` says what a plan built on them depends on (landlock.cached_plan's key): the searched folders'
    and site-packages' inodes and mtimes."""
    system = search_folders()
    sites = site_packages()
    key = {"version": CACHE_VERSION, "system": _folder_signature(system),
           "sites": [[s, _site_signature(s)] for s in sites]}
    folders = system + [f for s in sites for f in _site_folders(s)]
    files = _scan(folders)
    comp = Compilers(files, sorted({os.path.dirname(p) for p in files}))
    comp.cache_key = json.loads(json.dumps(key))  # type: ignore[attr-defined]  # tuples as lists, as in a file
    return comp


def read_private_json(path: str | None) -> dict | None:
    """A JSON object from a regular file of this user, opened without following a link; None otherwise."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return None
        with os.fdopen(fd) as f:
            fd = -1
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)
