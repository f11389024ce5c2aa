"""The models the build knows (one line per model), chosen by the HF config's model_type."""

from __future__ import annotations

from typing import Any

from nojit.aot.errors import BuildError
from nojit.aot.faces import Model
from nojit.aot.models import deepseek_v4

MODELS: dict[str, Model] = {
    deepseek_v4.MODEL.model_type: deepseek_v4.MODEL,
}


def model_for(hf_config: dict[str, Any], source: str) -> Model:
    """The model serving this HF config (read from `source`), or a BuildError naming what is known."""
    model_type = hf_config.get("model_type") if isinstance(hf_config, dict) else None
    model = MODELS.get(model_type) if isinstance(model_type, str) else None
    if model is None:
        raise BuildError(
            f"{source}: model_type is {model_type!r}, nojit's kernel tables cover {', '.join(MODELS)} only",
            fix="point [model] hf_config at a DeepSeek-V4 config.json",
        )
    return model
