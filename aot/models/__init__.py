"""The models the build knows (one line per model), chosen by the HF config's model_type, or by its
`text_config`'s when the checkpoint nests the language model (Qwen3.5)."""

from __future__ import annotations

from typing import Any

from nojit.aot.errors import BuildError
from nojit.aot.faces import Model
from nojit.aot.models import deepseek_v4, qwen3_5

MODELS: dict[str, Model] = {
    deepseek_v4.MODEL.model_type: deepseek_v4.MODEL,
    **{m.model_type: m for m in qwen3_5.MODELS},
}


def model_for(hf_config: dict[str, Any], source: str) -> Model:
    """The model serving this HF config (read from `source`), or a BuildError naming what is known."""
    model_type = hf_config.get("model_type") if isinstance(hf_config, dict) else None
    text = hf_config.get("text_config") if isinstance(hf_config, dict) else None
    text_type = text.get("model_type") if isinstance(text, dict) else None
    model = next((MODELS[t] for t in (model_type, text_type) if isinstance(t, str) and t in MODELS), None)
    if model is None:
        raise BuildError(
            f"{source}: model_type is {model_type!r} (text_config: {text_type!r}), nojit's kernel tables cover "
            f"{', '.join(MODELS)} only",
            fix="point [model] hf_config at a DeepSeek-V4, Qwen3.5 or Qwen3-Next config.json",
        )
    return model
