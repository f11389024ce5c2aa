"""Bundle files made byte by byte for the format tests, independently of aot/bundle_writer.py.

`seal` lays out a bundle (format 2: header, blobs, one section per kernel, index) from a
manifest in its logical form (one object, entries in one list, each naming its kernel; what
`Manifest.to_json` prints), with every digest right, so that a test can break any field,
even into something no writer would produce, and the break reaches the reader's checks:

* an entry whose kernel the index does not list goes into a section no kernel points to
  (a gap in the layout);
* a non-list `entries`, or a non-object `kernels`, is written where the reader will look.
"""

from __future__ import annotations

import hashlib
import json
import struct

import zstandard

from nojit.loader.bundle.file import HEADER, Header

FORMAT = 2


def _frame(raw: bytes, checksum: bool = False) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=True, write_checksum=checksum).compress(raw)


def seal(manifest: dict, blobs: dict[str, bytes], fmt: int = FORMAT) -> bytes:
    body = b""
    refs = {}
    for sha in sorted(blobs):
        frame = _frame(blobs[sha], checksum=True)
        refs[sha] = {"offset": HEADER.size + len(body), "length": len(frame), "size": len(blobs[sha])}
        body += frame
    index = {k: v for k, v in manifest.items() if k != "entries"}
    old_blobs = manifest.get("blobs")
    if isinstance(old_blobs, dict):
        index["blobs"] = {**refs, **{k: v for k, v in old_blobs.items() if k not in refs}}
    kernels = manifest.get("kernels")
    entries = manifest.get("entries", [])
    groups: dict[str, list] = {}
    if isinstance(entries, list):
        for e in entries:
            kernel = e.get("kernel") if isinstance(e, dict) else None
            key = kernel if isinstance(kernel, str) else json.dumps(kernel)
            groups.setdefault(key, []).append({k: v for k, v in e.items() if k != "kernel"} if isinstance(e, dict) else e)
    elif isinstance(kernels, dict) and kernels:
        groups[next(iter(kernels))] = entries  # not a list: the first kernel's section holds it
    if isinstance(kernels, dict):
        out = {}
        for kid, record in kernels.items():
            own = groups.pop(kid, [])
            raw = json.dumps(own).encode()
            frame = _frame(raw)
            section = {"offset": HEADER.size + len(body), "length": len(frame), "size": len(raw),
                       "sha256": hashlib.sha256(frame).hexdigest(), "entries": len(own) if isinstance(own, list) else 1}
            body += frame
            out[kid] = dict(record, section=section) if isinstance(record, dict) and "section" not in record else record
        index["kernels"] = out
    for orphan in groups.values():  # entries of kernels the index does not list
        body += _frame(json.dumps(orphan).encode())
    return with_index(b"\0" * HEADER.size + body, json.dumps(index).encode(), offset=HEADER.size + len(body), fmt=fmt)


def index_offset(data: bytes) -> int:
    return struct.unpack_from("<Q", data, 16)[0]


def index_json(data: bytes) -> bytes:
    """The raw index JSON of a sealed file."""
    moff, mlen = struct.unpack_from("<QQ", data, 16)
    return zstandard.ZstdDecompressor().decompress(data[moff:moff + mlen])


def with_index(data: bytes, raw_json: bytes, offset: int | None = None, declared: int | None = None,
               fmt: int = FORMAT) -> bytes:
    """`data` with its index replaced by `raw_json` (compressed, digest right), at `offset` (default: where it was)."""
    moff = index_offset(data) if offset is None else offset
    comp = _frame(raw_json)
    header = Header(fmt, 0, moff, len(comp), declared or len(raw_json), hashlib.sha256(comp).digest())
    return header.pack() + data[HEADER.size:moff] + comp
