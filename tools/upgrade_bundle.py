"""Rewrite a format-1 bundle (one manifest JSON) as format 2 (index + per-kernel sections), same contents.

    python tools/upgrade_bundle.py OLD.nojit NEW.nojit

For bundles built before the indexed layout (the loader refuses format 1): every entry goes through
format 2's own checks (manifest.parse_section) and every cubin is decompressed and hashed, then the
writer (aot/bundle_writer.py) lays the file out, so the result is byte-identical to what `nojit build`
writes for the same inputs. Nothing is recompiled.
"""

from __future__ import annotations

import json
import os
import sys


from nojit.aot.bundle_writer import write_bundle
from nojit.loader.bundle.file import HEADER, Bundle, _decompress
from nojit.loader.bundle.manifest import Index, parse_section


def upgrade(src: str, dst: str) -> int:
    with open(src, "rb") as f:
        data = f.read()
    _magic, fmt, _flags, moff, mlen, msize, _sha = HEADER.unpack_from(data, 0)
    if fmt != 1:
        raise SystemExit(f"{src} is format {fmt}, not 1")
    obj = json.loads(_decompress(data[moff:moff + mlen], msize, f"{src}: manifest"))
    entries = obj.pop("entries")
    groups: dict[str, list] = {}
    for e in entries:
        groups.setdefault(e["kernel"], []).append({k: v for k, v in e.items() if k != "kernel"})
    obj["format"] = 2
    for kid, record in obj["kernels"].items():
        record["section"] = {"offset": 0, "length": 1, "size": 1, "sha256": "0" * 64, "entries": len(groups.get(kid, []))}
    index = Index.from_json(obj, src, len(data))
    all_entries = []
    for kid, record in index.kernels.items():
        all_entries += parse_section(record, index.sections[kid], groups.get(kid, []), index.blobs, src)
    cubins = {}
    for sha, ref in index.blobs.items():
        raw = _decompress(data[ref.offset:ref.offset + ref.length], ref.size, f"{src}: cubin {sha[:12]}")
        cubins[sha] = raw
    write_bundle(dst, index.producer, index.target, index.deployment, index.kernels.values(), all_entries, cubins)
    return Bundle.open(dst).verify()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    n = upgrade(sys.argv[1], sys.argv[2])
    print(f"{sys.argv[2]}: format 2, {n} cubins verified ({os.path.getsize(sys.argv[2])} bytes)")
