"""The build's content-addressed compile cache: one compile result per digest of everything that shapes it.

A runtime states, per request, the inputs its output depends on (`Runtime.cache_inputs`: kernel
source digest, the key, compile options, the versions of its compilers, the target, nojit's own
compile code); their canonical JSON's sha256 names the entry. The build looks each request up in
the parent before any worker starts, compiles only the misses, and stores each result when it comes
back, so a rebuild after `--add-keys` compiles the new keys only, whatever the runtime.

Entries are files `<root>/<digest[:2]>/<digest>.entry`: one line of canonical JSON (the inputs, the
result's metadata, the payload's length and sha256), then the payload (the cubin). Writes go to a
temporary file in the same folder and are renamed into place, so concurrent builds and workers
never see a partial entry (two writers of one digest write the same content; the last rename wins).
An entry that does not parse, whose payload fails its sha256, or whose recorded inputs differ from
the request's is a miss (and is replaced by the next store), never an error.

The interface is runtime-neutral (`ArtifactCache`: inputs -> (meta, payload)); `CompileResultCodec`
maps it to the build's CompileResult with a runtime's launch type. Every runtime's planner declares
its inputs and launch type (Triton, TileLang, DeepGEMM, CuTeDSL, FlashInfer, Humming).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nojit.aot.bundle_writer import atomic_file
from nojit.aot.faces import CompileResult
# sha256 of a file's bytes (the compiler code that goes into a runtime's inputs): one function for the build and the
# loader (the bundle wheel's record), so the planners import it from here
from nojit.loader.bundle.installed import file_sha256  # noqa: F401

DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "nojit")  # `nojit build --cache-dir`'s default

SCHEMA = 1  # of the entry files; part of every digest
_MAX_META = 1 << 20


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def digest_of(inputs: dict[str, Any]) -> str:
    """The entry name for these inputs (canonical JSON, schema included)."""
    return hashlib.sha256(canonical({"schema": SCHEMA, "inputs": inputs})).hexdigest()


class ArtifactCache:
    """Content-addressed (meta, payload) entries under one folder, safe for concurrent readers and writers."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.hits = 0
        self.misses = 0
        self.stored = 0

    def _path(self, digest: str) -> str:
        return os.path.join(self.root, digest[:2], f"{digest}.entry")

    def get(self, inputs: dict[str, Any]) -> tuple[dict[str, Any], bytes] | None:
        digest = digest_of(inputs)
        try:
            with open(self._path(digest), "rb") as f:
                line = f.readline(_MAX_META)
                head = json.loads(line)
                payload = f.read(head["length"] + 1)
            ok = (isinstance(head, dict) and head.get("schema") == SCHEMA and head.get("inputs") == json.loads(
                canonical(inputs)) and len(payload) == head["length"]
                and hashlib.sha256(payload).hexdigest() == head["sha256"] and isinstance(head.get("meta"), dict))
        except (OSError, ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            self.misses += 1
            return None
        self.hits += 1
        return head["meta"], payload

    def put(self, inputs: dict[str, Any], meta: dict[str, Any], payload: bytes) -> None:
        digest = digest_of(inputs)
        path = self._path(digest)
        head = canonical({"schema": SCHEMA, "inputs": inputs, "meta": meta, "length": len(payload),
                          "sha256": hashlib.sha256(payload).hexdigest()})
        with atomic_file(path) as f:  # parallel writers of one digest: the last rename wins, every copy is whole
            f.write(head + b"\n" + payload)
        self.stored += 1


@dataclass(frozen=True)
class CompileResultCodec:
    """CompileResult <-> (meta, payload) for one runtime: the cubin is the payload, the launch is JSON."""

    launch_from_json: Callable[[dict[str, Any]], Any]

    def encode(self, result: CompileResult) -> tuple[dict[str, Any], bytes]:
        meta = {"launch": result.launch.to_json(), "source_hash": result.source_hash, "tools": result.tools,
                "kernel_info": result.kernel_info}
        return json.loads(canonical(meta)), result.cubin

    def decode(self, meta: dict[str, Any], payload: bytes) -> CompileResult | None:
        try:
            launch = self.launch_from_json(meta["launch"])
            return CompileResult(cubin=payload, launch=launch, source_hash=meta["source_hash"], tools=meta["tools"],
                                 kernel_info=meta["kernel_info"])
        except Exception:  # an entry of an older launch schema: a miss
            return None


def launch_reader(cls: Any) -> Callable[[dict[str, Any]], Any]:
    """A launch type's from_json over a plain dict (the manifest's own schema checks)."""
    from nojit.loader.bundle.manifest import _Fields

    return lambda obj: cls.from_json(_Fields(obj, "launch", "compile cache"))


class CompileCache:
    """The build's use of an ArtifactCache: per runtime, its cache inputs and its CompileResult codec."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.store_ = ArtifactCache(root)

    def lookup(self, rt: Any, request: Any, kernel: Any) -> CompileResult | dict[str, Any] | None:
        """The cached result, else the inputs to store the result under (None: the runtime caches nothing)."""
        if rt.cache_inputs is None or rt.launch_from_json is None:
            return None
        inputs = rt.cache_inputs(request, kernel)
        if inputs is None:
            return None
        found = self.store_.get(inputs)
        if found is not None:
            result = CompileResultCodec(rt.launch_from_json).decode(*found)
            if result is not None:
                return result
        return inputs

    def store(self, rt: Any, inputs: dict[str, Any], result: CompileResult) -> None:
        self.store_.put(inputs, *CompileResultCodec(rt.launch_from_json).encode(result))
