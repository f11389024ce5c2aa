"""A deployment: the serving facts that decide which kernels and keys a bundle must hold.

Read from a TOML file (`nojit build --deployment FILE`) or the built-in default, which is
the original report's command on an H200. Every field is validated here, with errors that
name the file and the field; what one model accepts (DeepSeek-V4: block size 256, mtp only) is that
model room's rule (`Model.check_deployment`), checked before planning with the same errors.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from nojit.aot.vllm_env import PlatformFacts
from nojit.aot.errors import BuildError

DEFAULT_DEPLOYMENT = "builtin:default-deployment.toml"
RUNNERS = ("v1", "v2")


@dataclass(frozen=True)
class Deployment:
    name: str
    source: str
    model_id: str
    hf_config: dict[str, Any]
    hf_config_source: str
    dtype: str
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    block_size: int
    kv_cache_dtype: str
    tensor_parallel_size: int
    model_runners: tuple[str, ...]
    speculative_method: str | None
    num_speculative_tokens: int
    platform: PlatformFacts
    cutedsl: bool
    extra: dict[str, Any] = field(default_factory=dict)
    # vLLM's --gdn-prefill-backend (additional_config gdn_prefill_backend) as written; None: vLLM's own "auto".
    # Which backend that makes is the GDN model room's to resolve (aot/models/qwen3_5/config.py).
    gdn_prefill_backend: str | None = None

    @property
    def spec_decode(self) -> bool:
        return self.speculative_method is not None and self.num_speculative_tokens > 0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["platform"] = self.platform.as_dict()
        d["model_runners"] = list(self.model_runners)
        del d["hf_config"]
        if d["gdn_prefill_backend"] is None:  # unset: the plans of deployments that never name it stay as they were
            del d["gdn_prefill_backend"]
        d["hf_config_sha256"] = hashlib.sha256(json.dumps(self.hf_config, sort_keys=True).encode()).hexdigest()
        return d


def _read_builtin(name: str) -> bytes:
    """A file shipped with nojit: aot/data/ (deployments), else a model folder's data (aot/models/*/)."""
    aot = resources.files("nojit.aot")
    folders = [aot / "data"] + sorted((f for f in (aot / "models").iterdir() if f.is_dir()), key=lambda f: f.name)
    for folder in folders:
        candidate = folder / name
        if candidate.is_file():
            return candidate.read_bytes()
    raise FileNotFoundError(name)


def _load_text(ref: str, base_dir: str) -> tuple[bytes, str]:
    if ref.startswith("builtin:"):
        name = ref.removeprefix("builtin:")
        try:
            return _read_builtin(name), ref
        except (FileNotFoundError, OSError):
            raise BuildError(f"no built-in file {name!r}", fix="use a path to your own file instead") from None
    path = ref if os.path.isabs(ref) else os.path.join(base_dir, ref)
    try:
        with open(path, "rb") as f:
            return f.read(), path
    except OSError as exc:
        raise BuildError(f"cannot read {path}: {exc.strerror}", fix="check the path in the deployment file") from None


def field_error(source: str, table: str, key: str, what: str) -> BuildError:
    """The error for one field of a deployment file (also raised by a model room's rules, aot/models/<m>/)."""
    return BuildError(f"{source}: [{table}] {key} {what}", fix="fix the deployment file (see the default: "
                      "`nojit build --print-default-deployment`)")


class _Table:
    def __init__(self, data: dict[str, Any], where: str, source: str) -> None:
        self.data, self.where, self.source = data, where, source

    def _bad(self, key: str, what: str) -> BuildError:
        return field_error(self.source, self.where, key, what)

    def get(self, key: str, kind: type, default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise self._bad(key, "is missing")
            return default
        v = self.data[key]
        if isinstance(v, bool) and kind is not bool:
            raise self._bad(key, f"is a boolean, expected {kind.__name__}")
        if not isinstance(v, kind):
            raise self._bad(key, f"is {type(v).__name__}, expected {kind.__name__}")
        return v

    def positive(self, key: str, default: Any = ...) -> int:
        v = self.get(key, int, default)
        if v <= 0:
            raise self._bad(key, f"= {v} must be positive")
        return v

    def sub(self, key: str, required: bool = True) -> _Table:
        if key not in self.data:
            if required:
                raise self._bad(key, "table is missing")
            return _Table({}, key, self.source)
        v = self.data[key]
        if not isinstance(v, dict):
            raise self._bad(key, "is not a table")
        return _Table(v, key, self.source)


def load_deployment(ref: str = DEFAULT_DEPLOYMENT) -> Deployment:
    """Parse and validate a deployment TOML (path, or builtin:<name>)."""
    raw, source = _load_text(ref, os.getcwd())
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BuildError(f"{source} is not valid TOML: {exc}", fix="fix the syntax of the deployment file") from None
    base_dir = os.path.dirname(os.path.abspath(source)) if not source.startswith("builtin:") else os.getcwd()
    top = _Table(data, "top level", source)
    model, serving = top.sub("model"), top.sub("serving")
    spec, plat = top.sub("speculative", required=False), top.sub("platform")
    hf_raw, hf_source = _load_text(model.get("hf_config", str), base_dir)
    try:
        hf_config = json.loads(hf_raw)
    except ValueError as exc:
        raise BuildError(f"{hf_source} is not valid JSON: {exc}", fix="point [model] hf_config at a config.json") from None
    if not isinstance(hf_config, dict):
        raise BuildError(f"{hf_source} is not a JSON object", fix="point [model] hf_config at a config.json")
    runners = serving.get("model_runners", list, ["v2"])
    if not runners or any(r not in RUNNERS for r in runners):
        raise serving._bad("model_runners", f"= {runners!r}; each entry must be one of {RUNNERS}")
    method = spec.get("method", str, None)  # which methods a model serves: its room's rules (Model.check_deployment)
    capability = plat.get("capability", list, [9, 0])
    if len(capability) != 2 or not all(isinstance(c, int) and not isinstance(c, bool) for c in capability):
        raise plat._bad("capability", "must be two integers, e.g. [9, 0]")
    if tuple(capability) != (9, 0):
        raise plat._bad("capability", f"= {capability}: nojit builds sm_90a cubins, which run on compute capability 9.0 only")
    block_size = serving.positive("block_size")
    kv = serving.get("kv_cache_dtype", str, "auto")
    return Deployment(
        name=top.get("name", str),
        source=source,
        model_id=model.get("id", str),
        hf_config=hf_config,
        hf_config_source=hf_source,
        dtype=model.get("dtype", str, "bfloat16"),
        max_num_batched_tokens=serving.positive("max_num_batched_tokens"),
        max_num_seqs=serving.positive("max_num_seqs"),
        max_model_len=serving.positive("max_model_len"),
        block_size=block_size,
        kv_cache_dtype=kv,
        tensor_parallel_size=serving.positive("tensor_parallel_size", 1),
        model_runners=tuple(runners),
        speculative_method=method,
        num_speculative_tokens=spec.get("num_speculative_tokens", int, 0) if method else 0,
        platform=PlatformFacts(
            device_name=plat.get("device_name", str, "NVIDIA H200"),
            capability=(capability[0], capability[1]),
            sm_count=plat.positive("sm_count"),
            pdl=plat.get("pdl", bool, True),
            deep_gemm=plat.get("deep_gemm", bool, True),
        ),
        cutedsl=plat.get("cutedsl", bool, True),
        gdn_prefill_backend=serving.get("gdn_prefill_backend", str, None),
    )


def default_deployment_text() -> str:
    return _read_builtin(DEFAULT_DEPLOYMENT.removeprefix("builtin:")).decode()
