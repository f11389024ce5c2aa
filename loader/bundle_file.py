"""The bundle file: layout, and the reader the serving process uses.

Layout (little-endian), one file:

    header   72 bytes: magic "NOJITBN1", format u32, flags u32, manifest offset u64,
             manifest length u64 (compressed), manifest size u64 (raw),
             sha256 of the compressed manifest (32 bytes)
    blobs    one zstandard frame per distinct cubin, content-addressed by the sha256 of
             the raw cubin
    manifest zstandard-compressed canonical JSON (see manifest.py)

Opening reads the header and the manifest only, and keeps the file open for the life of the
process: cubins are read from that descriptor (pread), never again by path, so a redeploy
that renames a new bundle over the path does not disturb a running server (the new bundle is
picked up at the next start). Every size is checked against the file and against fixed caps
before anything is allocated, decompression is streamed with a hard output limit, and every
inconsistency (short file, bad magic, digest mismatch, oversized field, trailing bytes) is a
BundleCorruptError naming the file. NOJIT_BUNDLE_SHA256, when set, is checked over the whole
file before any of it is parsed.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from dataclasses import dataclass
from typing import Any

import zstandard

from nojit.loader.errors import BundleCorruptError, BundleError, BundleMismatchError
from nojit.loader.manifest import FORMAT_VERSION, Entry, Manifest

MAGIC = b"NOJITBN1"
HEADER = struct.Struct("<8sIIQQQ32s")
# Caps, far above any real bundle (the default bundle's manifest is about 1 MB): a hostile
# file must not make the reader allocate or parse more than this.
MAX_MANIFEST_BYTES = 16 << 20
_FEED = 1024  # compressed bytes per decompression step: one step inflates to at most ~44 MiB
_WRITE_SIZE = 1 << 20
_HASH_CHUNK = 1 << 20
_FIX = "the bundle file is damaged, truncated or not a nojit bundle: rebuild it with `nojit build` and copy it again"


@dataclass(frozen=True)
class Header:
    format: int
    flags: int
    manifest_offset: int
    manifest_length: int
    manifest_size: int
    manifest_sha256: bytes

    def pack(self) -> bytes:
        return HEADER.pack(
            MAGIC,
            self.format,
            self.flags,
            self.manifest_offset,
            self.manifest_length,
            self.manifest_size,
            self.manifest_sha256,
        )


def canonical_json(obj: Any) -> bytes:
    """The one JSON encoding used for manifests and digests: sorted keys, no whitespace."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


class Bundle:
    """A bundle opened for reading: header and manifest validated, the file kept open for cubins."""

    def __init__(self, path: str, manifest: Manifest, header: Header, fd: int | None = None) -> None:
        self.path = path
        self.manifest = manifest
        self.header = header
        self._fd = fd
        self._by_kernel: dict[str, list[Entry]] = {}
        for e in manifest.entries:
            self._by_kernel.setdefault(e.kernel, []).append(e)

    @classmethod
    def open(cls, path: str | os.PathLike[str], expected_sha256: str | None = None) -> Bundle:
        """Open and fully validate a bundle. expected_sha256 (NOJIT_BUNDLE_SHA256) pins the file's digest."""
        path = os.fspath(path)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
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
            bundle = cls._parse(path, fd, expected_sha256)
        except BaseException:
            os.close(fd)
            raise
        return bundle

    @classmethod
    def _parse(cls, path: str, fd: int, expected_sha256: str | None) -> Bundle:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise BundleError(f"bundle path {path} is a directory", fix="point NOJIT_BUNDLE at the bundle file")
        size = st.st_size
        if expected_sha256 is not None:
            _check_pin(fd, size, path, expected_sha256)
        header = _read_header(_pread(fd, HEADER.size, 0, path), path, size)
        compressed = _pread(fd, header.manifest_length, header.manifest_offset, path)
        if len(compressed) != header.manifest_length:
            raise BundleCorruptError(f"{path}: truncated manifest", fix=_FIX)
        if hashlib.sha256(compressed).digest() != header.manifest_sha256:
            raise BundleCorruptError(f"{path}: manifest digest mismatch (the file was modified or damaged)", fix=_FIX)
        raw = _decompress(compressed, header.manifest_size, f"{path}: manifest")
        try:
            obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            detail = f": {exc}" if isinstance(exc, _DuplicateKey) else f" ({type(exc).__name__})"
            raise BundleCorruptError(f"{path}: manifest is not valid JSON{detail}", fix=_FIX) from None
        manifest = Manifest.from_json(obj, path, size)
        _check_layout(manifest, header, size, path)
        return cls(path, manifest, header, fd)

    def close(self) -> None:
        """Release the file (tools and tests; a serving process keeps it for its whole life)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def entries(self, kernel: str) -> list[Entry]:
        return self._by_kernel.get(kernel, [])

    def kernel_ids(self) -> list[str]:
        return sorted(self.manifest.kernels)

    def read_blob(self, sha256: str) -> bytes:
        """The raw cubin with this digest, decompressed and verified, read from the descriptor opened at open."""
        ref = self.manifest.blobs.get(sha256)
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
        """Read and check every cubin; returns how many. For `nojit inspect --verify`."""
        for sha in self.manifest.blobs:
            self.read_blob(sha)
        return len(self.manifest.blobs)


class _DuplicateKey(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object hook: a key given twice is damage (or an attempt to hide a value), never "last one wins"."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(f"key {k[:64]!r} appears twice in one object")
        out[k] = v
    return out


def _pread(fd: int, length: int, offset: int, path: str) -> bytes:
    try:
        return os.pread(fd, length, offset)
    except OSError as exc:
        raise BundleError(f"{path}: cannot read {length} bytes at {offset}: {exc.strerror}", fix=_FIX) from None


def _check_pin(fd: int, size: int, path: str, expected: str) -> None:
    """The whole file's sha256 against the pinned digest, streamed, before anything is parsed."""
    want = expected.strip().lower()
    if len(want) != 64 or not set(want) <= set("0123456789abcdef"):
        raise BundleError(f"NOJIT_BUNDLE_SHA256={expected!r} is not a sha256 hex digest",
                          fix="set it to the 64 hex digits `sha256sum` prints for the deployed bundle")
    h = hashlib.sha256()
    offset = 0
    while offset < size:
        chunk = _pread(fd, min(_HASH_CHUNK, size - offset), offset, path)
        if not chunk:
            break
        h.update(chunk)
        offset += len(chunk)
    if h.hexdigest() != want:
        raise BundleMismatchError(
            f"bundle {path} has sha256 {h.hexdigest()}, NOJIT_BUNDLE_SHA256 pins {want}",
            fix="deploy the bundle that was pinned, or update NOJIT_BUNDLE_SHA256 to the new bundle's digest",
        )


def _check_layout(manifest: Manifest, header: Header, size: int, path: str) -> None:
    """Blobs tile [header, manifest) exactly and the manifest ends the file: no gaps, overlaps or trailing bytes."""
    if header.manifest_offset + header.manifest_length != size:
        raise BundleCorruptError(
            f"{path}: {size - header.manifest_offset - header.manifest_length} bytes follow the manifest", fix=_FIX)
    at = HEADER.size
    for ref in sorted(manifest.blobs.values(), key=lambda r: r.offset):
        if ref.offset != at:
            raise BundleCorruptError(f"{path}: cubin {ref.sha256[:12]} at {ref.offset}, expected at {at} "
                                     "(blobs overlap or leave a gap)", fix=_FIX)
        at += ref.length
    if at != header.manifest_offset:
        raise BundleCorruptError(f"{path}: blobs end at {at}, the manifest starts at {header.manifest_offset}", fix=_FIX)


def _read_header(raw: bytes, path: str, size: int) -> Header:
    if len(raw) < HEADER.size:
        raise BundleCorruptError(f"{path}: {size} bytes is too short for a nojit bundle header", fix=_FIX)
    magic, fmt, flags, moff, mlen, msize, msha = HEADER.unpack(raw)
    if magic != MAGIC:
        raise BundleCorruptError(f"{path}: not a nojit bundle (magic {magic!r})", fix=_FIX)
    if fmt != FORMAT_VERSION:
        raise BundleMismatchError(
            f"{path}: bundle format {fmt}, this nojit reads format {FORMAT_VERSION}",
            fix="rebuild the bundle with this nojit version, or install the nojit that built it",
        )
    if flags != 0:
        raise BundleCorruptError(f"{path}: header flags {flags:#x} are not defined in format {fmt}", fix=_FIX)
    if moff < HEADER.size or mlen == 0 or moff + mlen > size:
        raise BundleCorruptError(f"{path}: manifest at {moff}+{mlen} lies outside the {size}-byte file", fix=_FIX)
    if not 0 < msize <= MAX_MANIFEST_BYTES:
        raise BundleCorruptError(f"{path}: manifest size {msize} is out of range (at most {MAX_MANIFEST_BYTES})", fix=_FIX)
    if mlen > _max_frame_length(msize):
        raise BundleCorruptError(f"{path}: manifest frame of {mlen} bytes for {msize} bytes of JSON", fix=_FIX)
    return Header(fmt, flags, moff, mlen, msize, msha)


def _max_frame_length(size: int) -> int:
    """zstandard's worst case for `size` bytes (ZSTD_compressBound) plus header and checksum."""
    return size + (size >> 8) + 64 + (128 << 10 if size < (128 << 10) else 0)


def _decompress(data: bytes, size: int, what: str) -> bytes:
    """One zstandard frame of exactly `size` bytes, streamed so that output never exceeds `size`."""
    try:
        declared = zstandard.frame_content_size(data)
        if declared != size:
            raise BundleCorruptError(f"{what}: frame declares {declared} bytes, expected {size}", fix=_FIX)
        dobj = zstandard.ZstdDecompressor().decompressobj(write_size=_WRITE_SIZE)
        parts: list[bytes] = []
        produced = consumed = 0
        while consumed < len(data) and not dobj.eof:
            part = dobj.decompress(data[consumed:consumed + _FEED])
            consumed += _FEED
            produced += len(part)
            if produced > size:
                raise BundleCorruptError(f"{what}: decompresses past its declared {size} bytes", fix=_FIX)
            parts.append(part)
        if not dobj.eof:
            raise BundleCorruptError(f"{what}: the zstandard frame is truncated", fix=_FIX)
        if dobj.unused_data or consumed < len(data):
            raise BundleCorruptError(f"{what}: bytes follow the zstandard frame", fix=_FIX)
    except zstandard.ZstdError as exc:
        raise BundleCorruptError(f"{what} does not decompress: {exc}", fix=_FIX) from None
    if produced != size:
        raise BundleCorruptError(f"{what}: {produced} bytes after decompression, expected {size}", fix=_FIX)
    return b"".join(parts)
