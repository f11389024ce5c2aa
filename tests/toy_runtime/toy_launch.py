"""The toy runtime's manifest launch record and key check (what a runtime adds to the format room)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nojit.loader.bundle.manifest import LaunchRecord


@dataclass(frozen=True)
class ToyLaunch:
    symbol: str
    grid: int

    def to_json(self) -> dict[str, Any]:
        return {"symbol": self.symbol, "grid": self.grid}

    @classmethod
    def from_json(cls, f: Any) -> ToyLaunch:
        grid = f.get("grid", int)
        if not 0 < grid < 1 << 16:
            raise f._bad("grid", f"= {grid} is not a grid size")
        return cls(f.str("symbol", max_len=64), grid)


def check_key(ef: Any, key: Any, launch: ToyLaunch, record: Any) -> None:
    if not (isinstance(key, dict) and set(key) == {"n"} and type(key["n"]) is int):
        raise ef._bad("key", "is not {n: <int>} (a toy kernel's key)")


RECORD = LaunchRecord(ToyLaunch.from_json, check_key)
