"""The namespace each model room builds its slice of vLLM's VllmConfig from (a real VllmConfig needs the checkpoint
and the device): a field a warmup-key provider reads and the view lacks is a BuildError naming the field and the
room's file to add it to, not an AttributeError."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from nojit.aot.errors import BuildError


class ConfigView(SimpleNamespace):
    """A namespace whose missing attributes are a clear BuildError, not an AttributeError."""

    _path = "vllm_config"
    _room = "nojit/aot/models/<model>/config_view.py"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise BuildError(
            f"a vLLM warmup-key provider read {self._path}.{name}, which nojit's deployment view does not hold",
            fix=f"add the field to {self._room} (and to the deployment file if it varies)",
        )


def config_view(room: str, path: str, **fields: Any) -> ConfigView:
    """A view at `path` (for messages) whose missing fields are to be added in `room` (a model room's file)."""
    v = ConfigView(**fields)
    object.__setattr__(v, "_path", path)
    object.__setattr__(v, "_room", room)
    return v
