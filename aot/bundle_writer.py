"""Write a bundle file: deterministic bytes, written to a temporary file and renamed.

Same inputs, same bytes: entries and blobs are sorted, the index and each kernel's section
are canonical JSON with no timestamps, and every zstandard frame is made with the same fixed
parameters. A crash or an error while writing leaves no bundle at the destination, only the
old one. Layout: loader/bundle/file.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import zstandard

from nojit.loader.bundle.file import HEADER, Header
from nojit.loader.bundle.canonical import canonical_json
from nojit.aot.errors import BuildError
from nojit.loader.bundle.manifest import (
    FORMAT_VERSION,
    BlobRef,
    Entry,
    Index,
    KernelRecord,
    Manifest,
    Producer,
    SectionRef,
    Target,
    entry_section_json,
)

ZSTD_LEVEL = 19


def _compressor() -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, write_checksum=True, threads=0)


def entry_sort_key(e: Entry) -> tuple[str, str, str]:
    return (e.kernel, canonical_json(e.key).decode(), e.variant)


def write_bundle(
    path: str,
    producer: Producer,
    target: Target,
    deployment: dict,
    kernels: Iterable[KernelRecord],
    entries: Iterable[Entry],
    cubins: dict[str, bytes],
) -> Manifest:
    """Write the bundle atomically. `cubins` maps sha256 hex -> raw cubin for every entry's blob."""
    kernel_map = {k.id: k for k in sorted(kernels, key=lambda k: k.id)}
    entry_list = sorted(entries, key=entry_sort_key)
    seen: set[tuple[str, str, str]] = set()
    for e in entry_list:
        if e.kernel not in kernel_map:
            raise BuildError(f"entry for {e.kernel} has no kernel record", fix="this is a nojit bug; report it")
        if e.blob not in cubins:
            raise BuildError(f"entry for {e.kernel} names a cubin that was not produced", fix="this is a nojit bug")
        k = entry_sort_key(e)
        if k in seen:
            raise BuildError(f"duplicate entry for {e.kernel} key {k[1]}", fix="this is a nojit bug; report it")
        seen.add(k)
    for sha, raw in cubins.items():
        if hashlib.sha256(raw).hexdigest() != sha:
            raise BuildError(f"cubin {sha[:12]} does not match its digest", fix="this is a nojit bug; report it")

    with atomic_file(path) as f:
        f.write(b"\0" * HEADER.size)
        blobs: dict[str, BlobRef] = {}
        used = sorted({e.blob for e in entry_list})
        for sha in used:
            frame = _compressor().compress(cubins[sha])
            blobs[sha] = BlobRef(sha, f.tell(), len(frame), len(cubins[sha]))
            f.write(frame)
        sections: dict[str, SectionRef] = {}
        for kid in kernel_map:
            own = [entry_section_json(e) for e in entry_list if e.kernel == kid]
            raw = canonical_json(own)
            frame = _compressor().compress(raw)
            sections[kid] = SectionRef(f.tell(), len(frame), len(raw), hashlib.sha256(frame).hexdigest(), len(own))
            f.write(frame)
        index = Index(FORMAT_VERSION, producer, target, deployment, kernel_map, blobs, sections)
        raw = canonical_json(index.to_json())
        compressed = _compressor().compress(raw)
        header = Header(
            format=FORMAT_VERSION,
            flags=0,
            index_offset=f.tell(),
            index_length=len(compressed),
            index_size=len(raw),
            index_sha256=hashlib.sha256(compressed).digest(),
        )
        f.write(compressed)
        f.seek(0)
        f.write(header.pack())
        manifest = Manifest(FORMAT_VERSION, producer, target, deployment, kernel_map, tuple(entry_list), blobs)
    return manifest


@contextlib.contextmanager
def atomic_file(path: str) -> Iterator[BinaryIO]:
    """A binary file that appears at `path` whole (synced, mode 0644) when the block ends, or not at all."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".nojit-", suffix=".partial", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_text_atomically(path: str, text: str) -> None:
    """Reports and plans: written whole or not at all, like bundles."""
    with atomic_file(path) as f:
        f.write(text.encode())
