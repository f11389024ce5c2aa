"""Folders only this user can write, and files written into them safely: the one place for both.

Every file nojit seeds is later loaded *by path* by a library nojit does not control (FlashInfer's
`dlopen`, TensorRT-LLM's and DeepGEMM's cubin reads, Humming's cache and its `tmp/module` folder on
`sys.path`). A path is only as safe as every folder on it: if another user can write any of them, they
can swap a file between nojit's digest check and the library's load, or plant a symlink that makes
nojit overwrite a file elsewhere. So a seeded folder is reached by walking its path one component at a
time with directory descriptors (`O_DIRECTORY|O_NOFOLLOW`, `dir_fd=`), and refused unless:

- no component is a symlink;
- every folder above it is owned by this user or root and not writable by group or other, except that
  a sticky world-writable folder (/tmp) is accepted as a parent (nobody else can rename or remove what
  this user made there);
- the folder itself (and each folder nojit creates on the way, mode 0700) is owned by this user and not
  writable by group or other (the runtime folder: no group or other access at all).

Files are created with `O_CREAT|O_EXCL|O_NOFOLLOW` through the folder's descriptor under a temporary
name, read back and hashed on that descriptor, then renamed into place with `src_dir_fd=`/`dst_dir_fd=`;
an existing file is opened with `O_NOFOLLOW` and hashed on the descriptor it was opened as, never by
opening the path again. Append-only logs (the event log, the record file) are opened the same way and
refused unless they are regular files of this user with one link.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat

from nojit.loader.errors import UnsafePathError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW = os.O_NOFOLLOW  # tests turn the defence off (positive controls) by setting this to 0
PRIVATE = 0o077  # the runtime folder: no group or other access
NO_WRITE = 0o022  # seeded folders: nobody but this user writes


_LOADS = "nojit seeds files there that libraries load by path, so another user could swap or plant them"
_APPENDS = "nojit appends to it, so it must be a regular file of this user that nobody else can replace"


def _refuse(path: str, why: str, fix: str | None = None, role: str = _LOADS) -> UnsafePathError:
    return UnsafePathError(f"{path}: {why}; {role}",
                           fix=fix or f"remove {path} (nojit creates it again, private) or point the setting that "
                                      "names it at a folder only this user can write")


def _check_parent(path: str, st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a folder")
    if st.st_uid not in (0, os.getuid()):
        raise _refuse(path, f"is a folder of user {st.st_uid} (above a seeded folder)")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise _refuse(path, f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o}, not sticky)")


def _check_own(path: str, st: os.stat_result, deny: int) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a folder")
    if st.st_uid != os.getuid():
        raise _refuse(path, f"is owned by user {st.st_uid}, not by this user ({os.getuid()})")
    if st.st_mode & deny:
        raise _refuse(path, f"has mode {stat.S_IMODE(st.st_mode):o}: other users can "
                            f"{'write' if st.st_mode & 0o022 else 'read'} it")


def _open_component(parent_fd: int, name: str, path: str, create: bool) -> tuple[int, bool]:
    """(descriptor, created) of one folder below parent_fd; never follows a symlink."""
    for _ in range(2):
        try:
            return os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=parent_fd), False
        except FileNotFoundError:
            if not create:
                raise UnsafePathError(f"{path} does not exist", fix=f"create {path} (mode 0700) or unset the setting "
                                                                    "that names it") from None
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            except FileExistsError:
                continue  # someone made it first: open and check it like any other
            except OSError as exc:
                raise UnsafePathError(f"cannot create folder {path}: {exc.strerror}",
                                      fix=f"make {os.path.dirname(path)} writable by this user, or point the setting "
                                          "that names it at a folder this user can write") from None
            return os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=parent_fd), True
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                kind = "is a symlink" if _is_link(parent_fd, name) else "is not a folder"
                raise _refuse(path, kind) from None
            raise UnsafePathError(f"cannot open folder {path}: {exc.strerror}",
                                  fix=f"check {path} and its parents") from None
    raise _refuse(path, "keeps changing while nojit opens it")


def _is_link(parent_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=parent_fd).st_mode)
    except OSError:
        return False


def _walk(path: str, create: bool, deny: int, leaf_is_parent: bool = False) -> int:
    """Descriptor of `path`, every component checked (module docstring). The caller closes it."""
    full = os.path.abspath(path)
    parts = [p for p in full.split("/") if p]
    fd = os.open("/", _DIR_FLAGS)
    try:
        _check_parent("/", os.fstat(fd))
        here = ""
        created_above = False
        for i, name in enumerate(parts):
            here += "/" + name
            nfd, created = _open_component(fd, name, here, create)
            os.close(fd)
            fd = nfd
            st = os.fstat(fd)
            leaf = i == len(parts) - 1
            if created or created_above:  # below a folder nojit made: ours, 0700
                created_above = True
                _check_own(here, st, PRIVATE)
            elif leaf and not leaf_is_parent:
                _check_own(here, st, deny)
            else:
                _check_parent(here, st)
        return fd
    except BaseException:
        os.close(fd)
        raise


class PrivateDir:
    """An open folder only this user can write (see the module docstring); use it as a context manager."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd

    def __enter__(self) -> PrivateDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def child(self, name: str, create: bool = True, tighten: bool = False) -> PrivateDir:
        """The folder `name` inside this one (made 0700 when absent), checked like this one. tighten: a folder
        of this user that a library made here with a loose mode (umask) is made 0700 first."""
        _plain_name(name, self.path)
        path = os.path.join(self.path, name)
        fd, _ = _open_component(self.fd, name, path, create)
        try:
            st = os.fstat(fd)
            if tighten and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & NO_WRITE:
                os.fchmod(fd, 0o700)
                st = os.fstat(fd)
            _check_own(path, st, NO_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return PrivateDir(path, fd)

    def descend(self, relative: str, create: bool = True) -> PrivateDir:
        """child() for each component of a relative path ("a/b/c")."""
        current = PrivateDir(self.path, os.dup(self.fd))
        try:
            for name in relative.split("/"):
                nxt = current.child(name, create)
                current.close()
                current = nxt
        except BaseException:
            current.close()
            raise
        return current

    def chmod(self, mode: int) -> None:
        os.fchmod(self.fd, mode)

    def sha256(self, name: str) -> str | None:
        """sha256 of the regular file `name` of this user, hashed on the descriptor it was opened as; None
        where there is no such file. A symlink or any other kind of file is refused."""
        _plain_name(name, self.path)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | _NOFOLLOW, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refuse(os.path.join(self.path, name), "is a symlink") from None
            raise UnsafePathError(f"cannot open {os.path.join(self.path, name)}: {exc.strerror}",
                                  fix=f"check {self.path}") from None
        try:
            _check_file(os.path.join(self.path, name), os.fstat(fd))
            return _hash_fd(fd)
        finally:
            os.close(fd)

    def write(self, name: str, data: bytes, mode: int = 0o444) -> str:
        """Replace `name` with `data` atomically (temporary O_EXCL file, then rename); returns the sha256
        read back from the written descriptor."""
        _plain_name(name, self.path)
        tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=self.fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            os.lseek(fd, 0, os.SEEK_SET)
            digest = _hash_fd(fd)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            tmp = ""
            return digest
        finally:
            os.close(fd)
            if tmp:
                try:
                    os.unlink(tmp, dir_fd=self.fd)
                except OSError:
                    pass

    def fchmod_file(self, name: str, mode: int) -> None:
        """chmod a regular file of this user in this folder, on its descriptor (never following a symlink)."""
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | _NOFOLLOW, dir_fd=self.fd)
        try:
            _check_file(os.path.join(self.path, name), os.fstat(fd))
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


def _plain_name(name: str, where: str) -> None:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise UnsafePathError(f"{name!r} is not a file name inside {where}", fix="this is a nojit bug; report it")


def _check_file(path: str, st: os.stat_result, role: str = _LOADS) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "is not a regular file", role=role)
    if st.st_uid != os.getuid():
        raise _refuse(path, f"is owned by user {st.st_uid}, not by this user ({os.getuid()})", role=role)
    if st.st_nlink != 1:
        raise _refuse(path, f"has {st.st_nlink} hard links (one of them may be another user's name for it)", role=role)


def _hash_fd(fd: int) -> str:
    h = hashlib.sha256()
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return h.hexdigest()


def open_private(path: str, create: bool = True, deny: int = NO_WRITE) -> PrivateDir:
    """The folder at `path`, made (0700) where absent, refused unless only this user can write it."""
    return PrivateDir(os.path.abspath(path), _walk(path, create, deny))


def open_append(path: str, mode: int = 0o600) -> int:
    """A descriptor appending to `path`: a regular file of this user with one link, created (O_EXCL) when
    absent, in a folder that passes the parent checks; never follows a symlink, never blocks on a FIFO."""
    full = os.path.abspath(path)
    folder, name = os.path.split(full)
    _plain_name(name, folder)
    dfd = _walk(folder, True, NO_WRITE, leaf_is_parent=True)
    try:
        for _ in range(2):
            try:
                fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK | _NOFOLLOW, dir_fd=dfd)
            except FileNotFoundError:
                try:
                    fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_CREAT | os.O_EXCL | _NOFOLLOW,
                                 mode, dir_fd=dfd)
                except FileExistsError:
                    continue
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise _refuse(full, "is a symlink", f"remove {full} or choose another file", _APPENDS) from None
                if exc.errno == errno.ENXIO:  # a FIFO with no reader
                    raise _refuse(full, "is not a regular file", f"remove {full} or choose another file", _APPENDS) from None
                raise UnsafePathError(f"cannot open {full}: {exc.strerror}", fix=f"check {full}") from None
            try:
                _check_file(full, os.fstat(fd), _APPENDS)
            except BaseException:
                os.close(fd)
                raise
            return fd
        raise _refuse(full, "keeps changing while nojit opens it", role=_APPENDS)
    finally:
        os.close(dfd)


def append_line(path: str, line: bytes, mode: int = 0o600) -> None:
    """One write(2) of `line` to the append-only file at `path` (open_append)."""
    fd = open_append(path, mode)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
