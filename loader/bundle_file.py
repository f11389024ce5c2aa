"""The bundle file: layout, and the reader the serving process uses.

Layout (little-endian), one file:

    header   72 bytes: magic "NOJITBN1", format u32, flags u32, manifest offset u64,
             manifest length u64 (compressed), manifest size u64 (raw),
             sha256 of the compressed manifest (32 bytes)
    blobs    one zstandard frame per distinct cubin, content-addressed by the sha256 of
             the raw cubin
    manifest zstandard-compressed canonical JSON (see manifest.py)

Opening reads the header and the manifest only; a cubin is read and decompressed when a
kernel first needs it, and its sha256 is checked then. Every inconsistency (short file,
bad magic, digest mismatch, oversized field) is a BundleCorruptError naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from typing import Any

import zstandard

from nojit.loader.errors import BundleCorruptError, BundleError, BundleMismatchError
from nojit.loader.manifest import FORMAT_VERSION, Entry, Manifest

MAGIC = b"NOJITBN1"
HEADER = struct.Struct("<8sIIQQQ32s")
MAX_MANIFEST_BYTES = 256 << 20
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
    """A bundle opened for reading. Cheap to open; cubins are read on demand."""

    def __init__(self, path: str, manifest: Manifest, header: Header) -> None:
        self.path = path
        self.manifest = manifest
        self.header = header
        self._by_kernel: dict[str, list[Entry]] = {}
        for e in manifest.entries:
            self._by_kernel.setdefault(e.kernel, []).append(e)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Bundle:
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                header = _read_header(f, path, size)
                f.seek(header.manifest_offset)
                compressed = f.read(header.manifest_length)
        except FileNotFoundError:
            raise BundleError(
                f"bundle {path} does not exist",
                fix="build one with `nojit build`, or point NOJIT_BUNDLE at the bundle file",
            ) from None
        except IsADirectoryError:
            raise BundleError(f"bundle path {path} is a directory", fix="point NOJIT_BUNDLE at the bundle file") from None
        except PermissionError:
            raise BundleError(f"bundle {path} is not readable", fix="fix the file's permissions") from None
        if len(compressed) != header.manifest_length:
            raise BundleCorruptError(f"{path}: truncated manifest", fix=_FIX)
        if hashlib.sha256(compressed).digest() != header.manifest_sha256:
            raise BundleCorruptError(f"{path}: manifest digest mismatch (the file was modified or damaged)", fix=_FIX)
        raw = _decompress(compressed, header.manifest_size, f"{path}: manifest")
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise BundleCorruptError(f"{path}: manifest is not valid JSON ({type(exc).__name__})", fix=_FIX) from None
        return cls(path, Manifest.from_json(obj, path, size), header)

    def entries(self, kernel: str) -> list[Entry]:
        return self._by_kernel.get(kernel, [])

    def kernel_ids(self) -> list[str]:
        return sorted(self.manifest.kernels)

    def read_blob(self, sha256: str) -> bytes:
        """The raw cubin with this digest, decompressed and verified."""
        ref = self.manifest.blobs.get(sha256)
        if ref is None:
            raise BundleCorruptError(f"{self.path}: no blob {sha256[:12]}", fix=_FIX)
        try:
            with open(self.path, "rb") as f:
                f.seek(ref.offset)
                compressed = f.read(ref.length)
        except OSError as exc:
            raise BundleError(f"{self.path}: cannot read cubin {sha256[:12]}: {exc}", fix=_FIX) from None
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


def _read_header(f: Any, path: str, size: int) -> Header:
    raw = f.read(HEADER.size)
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
        raise BundleCorruptError(f"{path}: manifest size {msize} is out of range", fix=_FIX)
    return Header(fmt, flags, moff, mlen, msize, msha)


def _decompress(data: bytes, size: int, what: str) -> bytes:
    try:
        # The frame header states its content size; refuse before allocating if it is not
        # the size the manifest (or header) promised.
        declared = zstandard.frame_content_size(data)
        if declared != size:
            raise BundleCorruptError(f"{what}: frame declares {declared} bytes, expected {size}", fix=_FIX)
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise BundleCorruptError(f"{what} does not decompress: {exc}", fix=_FIX) from None
    if len(raw) != size:
        raise BundleCorruptError(f"{what}: {len(raw)} bytes after decompression, expected {size}", fix=_FIX)
    return raw
