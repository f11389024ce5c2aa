"""FlashInfer's launch record: what a bundle entry of runtime "flashinfer" stores (the format's, read by the
manifest and written by the build side; loader/runtimes/flashinfer/serving.py seeds what it names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KINDS = ("module", "trtllm_deepgemm")


@dataclass(frozen=True)
class FlashInferLaunch:
    """A FlashInfer entry, found by its name where the loader seeds it; FlashInfer loads and launches it itself.
    kind "module": a JIT module's .so (<provider dir>/<name>/<name>.so); "trtllm_deepgemm": a TensorRT-LLM
    DeepGEMM cubin of fp8_blockscale_gemm_90 ($TRTLLM_DG_CACHE_DIR/cache/<name>/nvcc_kernel.cubin)."""

    module: str
    kind: str = "module"

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module} if self.kind == "module" else {"module": self.module, "kind": self.kind}

    @classmethod
    def from_json(cls, f: Any) -> FlashInferLaunch:
        name = f.str("module", max_len=128)
        if not name.isidentifier():
            raise f._bad("module", f"= {name!r:.80} is not a FlashInfer module or cache entry name")
        kind = f.str("kind", optional=True) or "module"
        if kind not in KINDS:
            raise f._bad("kind", f"= {kind!r:.40} is not one of {KINDS}")
        return cls(name, kind)
