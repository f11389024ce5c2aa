"""The bundle file: layout, and the reader the serving process uses.

Layout (little-endian), one file, format 2:

    header   72 bytes: magic "NOJITBN1", format u32, flags u32, index offset u64,
             index length u64 (compressed), index size u64 (raw),
             sha256 of the compressed index (32 bytes)
    blobs    one zstandard frame per distinct cubin, content-addressed by the sha256 of
             the raw cubin
    sections one zstandard frame per kernel: canonical JSON list of its entries; the index
             records each one's place, size, entry count and sha256
    index    zstandard-compressed canonical JSON: producer, target, deployment, kernel
             records with their section, blob table (manifest.Index)

Opening reads the header and the index only (a few tens of KB for the default bundle): the
index digest, every field of the index and the layout (blobs and sections tile the file
exactly, the index ends it) are checked then. A kernel's section is read, digest-checked,
decoded and validated at its first use (`entries`), with the same schema checks format 1 ran
over the whole manifest at open; a cubin is decompressed and hashed at its first load.
`verify()` (`nojit inspect --verify`) does all of it for every section and cubin. The file is
kept open for the life of the process: sections and cubins are read from that descriptor
(pread), never again by path, so a redeploy that renames a new bundle over the path does not
disturb a running server (the new bundle is picked up at the next start). Every size is
checked against the file and against fixed caps before anything is allocated, decompression
is streamed with a hard output limit, and every inconsistency (short file, bad magic, digest
mismatch, oversized field, trailing bytes) is a BundleCorruptError naming the file.
NOJIT_BUNDLE_SHA256 (or an installed bundle wheel's recorded digest), when given, is checked
over the whole file, streamed once from the descriptor, before any of it is parsed; the header
and the index that are parsed are the bytes of that stream (never read again), so a writer
changing the file in place cannot get an unpinned index accepted. Only a regular file is
opened, without blocking (a FIFO or a device is refused on the descriptor).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import threading
from dataclasses import dataclass
from typing import Any

import zstandard

from nojit.loader.bundle.canonical import canonical_json
from nojit.loader.errors import BundleCorruptError, BundleError, BundleMismatchError
from nojit.loader.bundle.manifest import (
    FORMAT_VERSION,
    VARIANTS,
    Entry,
    Index,
    Manifest,
    format_error,
    parse_section,
    parse_section_part,
)

MAGIC = b"NOJITBN1"
HEADER = struct.Struct("<8sIIQQQ32s")
# Caps, far above any real bundle (the default bundle's index is about 90 KB, its largest
# section about 200 KB): a hostile file must not make the reader allocate or parse more.
MAX_MANIFEST_BYTES = 16 << 20  # the index
_HASH_CHUNK = 1 << 20
_FIX = "the bundle file is damaged, truncated or not a nojit bundle: rebuild it with `nojit build` and copy it again"


@dataclass(frozen=True)
class Header:
    format: int
    flags: int
    index_offset: int
    index_length: int
    index_size: int
    index_sha256: bytes

    def pack(self) -> bytes:
        return HEADER.pack(
            MAGIC,
            self.format,
            self.flags,
            self.index_offset,
            self.index_length,
            self.index_size,
            self.index_sha256,
        )


@dataclass(frozen=True)
class Pin:
    """A whole-file sha256 the bundle must have, who set it, and what to do when the file differs."""

    sha256: str
    by: str = "NOJIT_BUNDLE_SHA256"
    fix: str = "deploy the bundle that was pinned, or update NOJIT_BUNDLE_SHA256 to the new bundle's digest"
    recorded: bool = False  # recorded with the file (a bundle wheel): a mismatch is damage (BundleCorruptError)


def _bundle_path(path: object) -> str:
    """A bundle path as given to Bundle.open: a non-empty str (or os.PathLike of one) without NUL bytes."""
    fix = "pass the bundle file's path as a string (NOJIT_BUNDLE=/path/to/bundle.nojit)"
    if not isinstance(path, (str, os.PathLike)):
        raise BundleError(f"bundle path {path!r:.80} is a {type(path).__name__}, not a path", fix=fix)
    try:
        text = os.fspath(path)
    except TypeError:
        text = None
    if not isinstance(text, str):
        raise BundleError(f"bundle path {path!r:.80} is not a text path", fix=fix)
    if not text or "\0" in text:
        raise BundleError(f"bundle path {text!r:.80} is empty or holds a NUL byte", fix=fix)
    return text


def _pin_of(expected_sha256: object, pin: object) -> Pin | None:
    """The pin Bundle.open checks: expected_sha256 (a hex str) or pin (a Pin), not both; each type-checked."""
    if pin is not None:
        if not isinstance(pin, Pin) or not isinstance(pin.sha256, str):
            raise BundleError(f"pin {pin!r:.80} is not a Pin with a str digest",
                              fix="pass pin=Pin(\"<64 hex digits>\") or expected_sha256=\"<64 hex digits>\"")
        if expected_sha256 is not None:
            raise BundleError("both expected_sha256 and pin were given", fix="pass one of them")
        _pin_digest(pin)
        return pin
    if expected_sha256 is None:
        return None
    if not isinstance(expected_sha256, str):
        raise BundleError(f"expected_sha256={expected_sha256!r:.80} is a {type(expected_sha256).__name__}, not a str",
                          fix="pass the 64 hex digits `sha256sum` prints for the bundle, as a string")
    _pin_digest(Pin(expected_sha256))
    return Pin(expected_sha256)


class Bundle:
    """A bundle opened for reading: header and index validated, sections and cubins read at first use."""

    def __init__(self, path: str, index: Index, header: Header, fd: int | None = None) -> None:
        self.path = path
        self.index = index
        self.header = header
        self._fd = fd
        self._sections: dict[str, tuple[Entry, ...]] = {}
        self._parts: dict[tuple[str, str], tuple[Entry, ...]] = {}  # (kernel, variant) -> its entries
        self._raw: dict[str, Any] = {}  # kernel -> its section's JSON, digest checked, while a part is unread
        self._manifest: Manifest | None = None
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str | os.PathLike[str], expected_sha256: str | None = None, pin: Pin | None = None) -> Bundle:
        """Open a bundle, checking header, index and layout. expected_sha256 (NOJIT_BUNDLE_SHA256) or pin (a
        bundle wheel's recorded digest) pins the whole file's digest, checked on the descriptor before parsing."""
        path = _bundle_path(path)
        pin = _pin_of(expected_sha256, pin)
        try:  # never blocks: a FIFO or a device is refused on the descriptor (fstat) before anything is read
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise BundleError(
                f"bundle {path} does not exist",
                fix="build one with `nojit build`, or point NOJIT_BUNDLE at the bundle file",
            ) from None
        except IsADirectoryError:
            raise BundleError(f"bundle path {path} is a directory", fix="point NOJIT_BUNDLE at the bundle file") from None
        except PermissionError:
            raise BundleError(f"bundle {path} is not readable", fix="fix the file's permissions") from None
        except OSError as exc:
            raise BundleError(f"bundle {path} cannot be opened: {exc.strerror}", fix="point NOJIT_BUNDLE at the bundle file") from None
        try:
            bundle = cls._parse(path, fd, pin)
        except BaseException:
            os.close(fd)
            raise
        return bundle

    @classmethod
    def _parse(cls, path: str, fd: int, pin: Pin | None) -> Bundle:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise BundleError(f"bundle path {path} is a directory", fix="point NOJIT_BUNDLE at the bundle file")
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"bundle {path} is not a regular file ({_file_kind(st.st_mode)})",
                              fix="point NOJIT_BUNDLE at the bundle file itself")
        os.set_blocking(fd, True)
        size = st.st_size
        if pin is not None:
            head, compressed = _pinned_head_and_index(fd, size, path, pin)
            header = _read_header(head, path, size)
        else:
            header = _read_header(_pread(fd, HEADER.size, 0, path), path, size)
            compressed = _pread(fd, header.index_length, header.index_offset, path)
        if len(compressed) != header.index_length:
            raise BundleCorruptError(f"{path}: truncated index", fix=_FIX)
        if hashlib.sha256(compressed).digest() != header.index_sha256:
            raise BundleCorruptError(f"{path}: index digest mismatch (the file was modified or damaged)", fix=_FIX)
        raw = _decompress(compressed, header.index_size, f"{path}: index")
        index = Index.from_json(_json(raw, f"{path}: index"), path, size)
        _check_layout(index, header, size, path)
        return cls(path, index, header, fd)

    def close(self) -> None:
        """Release the file (tools and tests; a serving process keeps it for its whole life)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def entries(self, kernel: str) -> tuple[Entry, ...]:
        """The kernel's entries; its section is read and validated at the first call (thread-safe)."""
        found = self._sections.get(kernel) if isinstance(kernel, str) else _not_a_name("kernel", kernel)
        if found is None:
            if kernel not in self.index.sections:
                return ()
            with self._lock:
                found = self._sections.get(kernel)
                if found is None:
                    found = self._sections[kernel] = self._read_section(kernel)
        return found

    def entries_of_variant(self, kernel: str, variant: str) -> tuple[Entry, ...]:
        """One variant's entries of the kernel (a Triton server's exact entries at first use, its generic ones at
        its first miss), each validated as entries() would, when first asked for (thread-safe)."""
        if not isinstance(kernel, str) or not isinstance(variant, str):
            _not_a_name("kernel and variant", (kernel, variant))
        found = self._parts.get((kernel, variant))
        if found is None:
            if kernel not in self.index.sections:
                return ()
            with self._lock:
                found = self._parts.get((kernel, variant))
                if found is None:
                    whole = self._sections.get(kernel)
                    if whole is not None:
                        found = tuple(e for e in whole if e.variant == variant)
                    else:
                        raw = self._raw.get(kernel)
                        if raw is None:
                            raw = self._raw[kernel] = self._read_raw(kernel)
                        found = parse_section_part(self.index.kernels[kernel], self.index.sections[kernel], raw,
                                                   self.index.blobs, self.path, variant)
                    self._parts[(kernel, variant)] = found
                    if all((kernel, v) in self._parts for v in VARIANTS):
                        self._raw.pop(kernel, None)
        return found

    def _read_section(self, kernel: str) -> tuple[Entry, ...]:
        raw = self._raw.pop(kernel, None)
        if raw is None:
            raw = self._read_raw(kernel)
        ref = self.index.sections[kernel]
        return parse_section(self.index.kernels[kernel], ref, raw, self.index.blobs, self.path)

    def _read_raw(self, kernel: str) -> Any:
        """The kernel's section as JSON, its digest checked."""
        ref = self.index.sections[kernel]
        what = f"{self.path}: section of kernel {kernel}"
        if self._fd is None:
            raise BundleError(f"{self.path}: the bundle was closed", fix="open it again (this is a nojit bug in serving)")
        compressed = _pread(self._fd, ref.length, ref.offset, self.path)
        if len(compressed) != ref.length:
            raise BundleCorruptError(f"{what} is truncated", fix=_FIX)
        if hashlib.sha256(compressed).hexdigest() != ref.sha256:
            raise BundleCorruptError(f"{what}: section digest mismatch (the file was modified or damaged)", fix=_FIX)
        return _json(_decompress(compressed, ref.size, what), what)

    @property
    def manifest(self) -> Manifest:
        """The whole manifest, every section read and validated (tools, tests, the builder's merge)."""
        if self._manifest is None:
            ix = self.index
            entries = tuple(e for kid in sorted(ix.kernels) for e in self.entries(kid))
            self._manifest = Manifest(ix.format, ix.producer, ix.target, ix.deployment, ix.kernels, entries, ix.blobs)
        return self._manifest

    def kernel_ids(self) -> list[str]:
        return sorted(self.index.kernels)

    def read_blob(self, sha256: str) -> bytes:
        """The raw cubin with this digest, decompressed and verified, read from the descriptor opened at open."""
        ref = self.index.blobs.get(sha256) if isinstance(sha256, str) else _not_a_name("blob digest", sha256)
        if ref is None:
            raise BundleCorruptError(f"{self.path}: no blob {sha256[:12]}", fix=_FIX)
        if self._fd is None:
            raise BundleError(f"{self.path}: the bundle was closed", fix="open it again (this is a nojit bug in serving)")
        compressed = _pread(self._fd, ref.length, ref.offset, self.path)
        if len(compressed) != ref.length:
            raise BundleCorruptError(f"{self.path}: cubin {sha256[:12]} is truncated", fix=_FIX)
        raw = _decompress(compressed, ref.size, f"{self.path}: cubin {sha256[:12]}")
        if hashlib.sha256(raw).hexdigest() != sha256:
            raise BundleCorruptError(f"{self.path}: cubin {sha256[:12]} fails its sha256 check", fix=_FIX)
        return raw

    def verify(self) -> int:
        """Read and check every section and every cubin; returns how many cubins. For `nojit inspect --verify`."""
        for kid in self.kernel_ids():
            self.entries(kid)
        for sha in self.index.blobs:
            self.read_blob(sha)
        return len(self.index.blobs)


def _not_a_name(what: str, value: object) -> Any:
    raise BundleError(f"{what} {value!r:.80} is not a str", fix="pass the name as a str (a nojit bug if it came from nojit)")


def _json(raw: bytes, what: str) -> Any:
    """Strict JSON: UTF-8, one value, no key twice in an object."""
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        detail = f": {exc}" if isinstance(exc, _DuplicateKey) else f" ({type(exc).__name__})"
        raise BundleCorruptError(f"{what} is not valid JSON{detail}", fix=_FIX) from None


class _DuplicateKey(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object hook: a key given twice is damage (or an attempt to hide a value), never "last one wins"."""
    out = dict(pairs)  # built in C; a key given twice leaves fewer keys than pairs
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(f"key {k[:64]!r} appears twice in one object")
            seen.add(k)
    return out


def _pread(fd: int, length: int, offset: int, path: str) -> bytes:
    try:
        return os.pread(fd, length, offset)
    except OSError as exc:
        raise BundleError(f"{path}: cannot read {length} bytes at {offset}: {exc.strerror}", fix=_FIX) from None


def _pinned_head_and_index(fd: int, size: int, path: str, pin: Pin) -> tuple[bytes, bytes]:
    """The header and the compressed index, taken from the very bytes whose sha256 is checked against the pin.

    The whole file is streamed once from the descriptor; the header and the index are kept out of that stream
    as it is hashed, so a writer changing the file in place cannot have other bytes parsed than those that
    matched the pin (sections and cubins read later are checked against the digests this index holds)."""
    want = _pin_digest(pin)
    h = hashlib.sha256()
    head = b""
    index = bytearray()
    start = end = -1  # the index's place, known once the header is in
    offset = 0
    while offset < size:
        chunk = _pread(fd, min(_HASH_CHUNK, size - offset), offset, path)
        if not chunk:
            break
        h.update(chunk)
        if len(head) < HEADER.size:
            head += chunk[:HEADER.size - len(head)]
            if len(head) == HEADER.size:
                _, _, _, moff, mlen, _, _ = HEADER.unpack(head)
                start, end = moff, moff + mlen
        if start >= 0 and offset + len(chunk) > start and offset < end:
            index += chunk[max(start - offset, 0):end - offset]
        offset += len(chunk)
    got = h.hexdigest()
    if got != want:
        if pin.recorded:
            raise BundleCorruptError(f"{pin.by}: {path} has sha256 {got[:16]}..., {pin.by} recorded "
                                     f"{want[:16]}... (the file was modified or damaged)", fix=pin.fix)
        raise BundleMismatchError(f"bundle {path} has sha256 {got}, {pin.by} pins {want}", fix=pin.fix)
    return head, bytes(index)


def _pin_digest(pin: Pin) -> str:
    """The pinned digest, lower case; anything but 64 hex digits is refused (an empty pin is not "no pin")."""
    raw = pin.sha256
    want = raw.strip().lower() if isinstance(raw, str) else ""
    if len(want) != 64 or not set(want) <= set("0123456789abcdef"):
        raise BundleError(f"{pin.by}={raw!r:.80} is not a sha256 hex digest",
                          fix="set it to the 64 hex digits `sha256sum` prints for the deployed bundle")
    return want


def _check_layout(index: Index, header: Header, size: int, path: str) -> None:
    """Blobs, then sections, tile [header, index) exactly and the index ends the file: no gaps, overlaps or
    trailing bytes."""
    if header.index_offset + header.index_length != size:
        raise BundleCorruptError(
            f"{path}: {size - header.index_offset - header.index_length} bytes follow the index", fix=_FIX)
    at = HEADER.size
    parts = [(r.offset, r.length, f"cubin {r.sha256[:12]}") for r in index.blobs.values()]
    parts += [(r.offset, r.length, f"section of kernel {kid}") for kid, r in index.sections.items()]
    for offset, length, what in sorted(parts):
        if offset != at:
            raise BundleCorruptError(f"{path}: {what} at {offset}, expected at {at} "
                                     "(blobs or sections overlap or leave a gap)", fix=_FIX)
        at += length
    if at != header.index_offset:
        raise BundleCorruptError(f"{path}: blobs and sections end at {at}, the index starts at {header.index_offset}",
                                 fix=_FIX)


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return f"mode {stat.S_IFMT(mode):#o}"


def _read_header(raw: bytes, path: str, size: int) -> Header:
    if len(raw) < HEADER.size:
        raise BundleCorruptError(f"{path}: {size} bytes is too short for a nojit bundle header", fix=_FIX)
    magic, fmt, flags, moff, mlen, msize, msha = HEADER.unpack(raw)
    if magic != MAGIC:
        raise BundleCorruptError(f"{path}: not a nojit bundle (magic {magic!r})", fix=_FIX)
    if fmt != FORMAT_VERSION:
        raise format_error(path, fmt)
    if flags != 0:
        raise BundleCorruptError(f"{path}: header flags {flags:#x} are not defined in format {fmt}", fix=_FIX)
    if moff < HEADER.size or mlen == 0 or moff + mlen > size:
        raise BundleCorruptError(f"{path}: index at {moff}+{mlen} lies outside the {size}-byte file", fix=_FIX)
    if not 0 < msize <= MAX_MANIFEST_BYTES:
        raise BundleCorruptError(f"{path}: index size {msize} is out of range (at most {MAX_MANIFEST_BYTES})", fix=_FIX)
    if mlen > _max_frame_length(msize):
        raise BundleCorruptError(f"{path}: index frame of {mlen} bytes for {msize} bytes of JSON", fix=_FIX)
    return Header(fmt, flags, moff, mlen, msize, msha)


def _max_frame_length(size: int) -> int:
    """zstandard's worst case for `size` bytes (ZSTD_compressBound) plus header and checksum."""
    return size + (size >> 8) + 64 + (128 << 10 if size < (128 << 10) else 0)


def _decompress(data: bytes, size: int, what: str) -> bytes:
    """One zstandard frame of exactly `size` bytes, inflated in one call into a buffer of `size` bytes.

    The frame must declare its content size and declare exactly `size` (bounded by the manifest's limits), so
    the output buffer is allocated once at that size; zstd itself rejects a frame that inflates past what it
    declares, and `allow_extra_data=False` rejects bytes after the frame."""
    try:
        declared = zstandard.frame_content_size(data)
        if declared != size:
            raise BundleCorruptError(f"{what}: frame declares {declared} bytes, expected {size}", fix=_FIX)
        raw = _decompressor().decompress(data, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        if "unused data" in str(exc):  # allow_extra_data=False: a second frame or other bytes after this one
            raise BundleCorruptError(f"{what}: bytes follow the zstandard frame", fix=_FIX) from None
        raise BundleCorruptError(f"{what} does not decompress: {exc}", fix=_FIX) from None
    if len(raw) != size:
        raise BundleCorruptError(f"{what}: {len(raw)} bytes after decompression, expected {size}", fix=_FIX)
    return raw


_LOCAL = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    """One decompression context per thread (a ZstdDecompressor is not shared across threads), kept for reuse."""
    dctx = getattr(_LOCAL, "dctx", None)
    if dctx is None:
        dctx = _LOCAL.dctx = zstandard.ZstdDecompressor()
    return dctx
