"""The one JSON encoding of the bundle format (manifests, sections, digests): its own module so the reader
(bundle_file), the schema (manifest) and the writer (aot/bundle_writer) all import it downward."""

from __future__ import annotations

import json
from typing import Any


def canonical_json(obj: Any) -> bytes:
    """The one JSON encoding used for manifests and digests: sorted keys, no whitespace."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
