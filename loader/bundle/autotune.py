"""What a bundle records of an autotuned Triton kernel: its tuning keys, each key's configs, and the winner.

Triton's `Autotuner` picks one `Config` per tuning key (the `key` argument values plus `str(dtype)` of each
tensor argument, `triton/runtime/autotuner.py` `Autotuner.run`). The build runs Triton's own `run` on the
stand-in GPU and records, per tuning key, every config left after Triton's own pruning; each config is an
ordinary exact key of the inner JITFunction, compiled ahead. `nojit tune` adds the winner of each key.

In the manifest it is the optional `info["autotune"]` of the inner JITFunction's kernel record (older
bundles have none; an older nojit ignores it and lets Triton benchmark):

    {"configs": [{name: [type, value], ...}, ...],        # Config.all_kwargs(), values tagged (key_values)
     "keys": [{"key": [[type, value], ...],                 # the tuning key, values tagged
               "configs": [i, ...],                         # indices into "configs": Triton's pruned list
               "winner": i}, ...]}                          # optional; one of that key's "configs"

It is checked when the index is read (at open): a bad value is a BundleCorruptError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nojit.loader.bundle.canonical import canonical_json
from nojit.loader.bundle.key_values import UnsupportedArgument, check_tagged, tag, untag
from nojit.loader.errors import BundleCorruptError

MAX_CONFIGS = 1024  # per kernel (FLA's largest has 36; a bound against hostile files, not a tuning)
MAX_TUNING_KEYS = 1 << 16
MAX_KEY_VALUES = 256
_REBUILD = "rebuild the bundle with `nojit build` (and `nojit tune` it again), or copy it again"


@dataclass(frozen=True)
class TuningKey:
    """One tuning key: its values (Python form, as Triton computes it), its configs (indices) and the winner."""

    values: tuple[Any, ...]
    configs: tuple[int, ...]
    winner: int | None
    call: dict[str, Any] | None = None  # the recorded call without the config (`nojit tune` replays it)

    def text(self) -> str:
        return repr(self.values)


@dataclass(frozen=True)
class AutotuneRecord:
    """The parsed `info["autotune"]` of one kernel record."""

    configs: tuple[dict[str, Any], ...]  # each config's all_kwargs() in Python form
    configs_json: tuple[str, ...]  # canonical JSON of each config's tagged form (the identity compared at serve)
    keys: tuple[TuningKey, ...]

    @property
    def tuned(self) -> int:
        return sum(k.winner is not None for k in self.keys)

    @classmethod
    def from_json(cls, obj: Any, where: str, source: str) -> AutotuneRecord:
        def bad(what: str) -> BundleCorruptError:
            sep = "" if what.startswith(".") else " "
            return BundleCorruptError(f"{source}: manifest field {where}{sep}{what}", fix=_REBUILD)

        if not isinstance(obj, dict) or set(obj) != {"configs", "keys"}:
            raise bad("is not an object of 'configs' and 'keys'")
        raw_configs, raw_keys = obj["configs"], obj["keys"]
        if not isinstance(raw_configs, list) or not 1 <= len(raw_configs) <= MAX_CONFIGS:
            raise bad(f".configs is not a list of 1 to {MAX_CONFIGS} configs")
        configs, configs_json = [], []
        for i, c in enumerate(raw_configs):
            try:
                configs.append(config_from_json(c))
            except (ValueError, UnsupportedArgument) as exc:
                raise bad(f".configs[{i}] is not a config: {exc}") from None
            configs_json.append(canonical_json(c).decode())
        if len(set(configs_json)) != len(configs_json):
            raise bad(".configs lists a config twice")
        if not isinstance(raw_keys, list) or len(raw_keys) > MAX_TUNING_KEYS:
            raise bad(f".keys is not a list of at most {MAX_TUNING_KEYS} tuning keys")
        keys, seen = [], set()
        for i, k in enumerate(raw_keys):
            at = f".keys[{i}]"
            if not isinstance(k, dict) or not {"key", "configs"} <= set(k) <= {"key", "configs", "winner", "call"}:
                raise bad(f"{at} is not an object of 'key', 'configs' and optional 'winner' and 'call'")
            try:
                values = tuning_key_from_json(k["key"])
            except (ValueError, UnsupportedArgument) as exc:
                raise bad(f"{at}.key is not a tuning key: {exc}") from None
            if values in seen:
                raise bad(f"{at}.key {values!r:.120} is listed twice")
            seen.add(values)
            idx = k["configs"]
            if not isinstance(idx, list) or not idx or not all(
                    type(j) is int and 0 <= j < len(configs) for j in idx) or len(set(idx)) != len(idx):
                raise bad(f"{at}.configs is not a non-empty list of distinct indices into .configs")
            winner = k.get("winner")
            if winner is not None and (type(winner) is not int or winner not in idx):
                raise bad(f"{at}.winner = {winner!r:.40} is not among that key's configs {idx}")
            call = k.get("call")
            if call is not None:
                problem = _call_problem(call, idx)
                if problem:
                    raise bad(f"{at}.call {problem}")
            keys.append(TuningKey(values, tuple(idx), winner, call))
        return cls(tuple(configs), tuple(configs_json), tuple(keys))


_ARG_FIELDS = {"value", "tensor", "shape", "strides", "values", "repr"}


def _call_problem(call: Any, configs: list[int]) -> str:
    """What is wrong with a recorded call ('' if nothing): {"args": {name: description}, "grids": {index: [3 ints]}}."""
    if not isinstance(call, dict) or set(call) != {"args", "grids"}:
        return "is not an object of 'args' and 'grids'"
    args, grids = call["args"], call["grids"]
    if not isinstance(args, dict) or len(args) > 4096:
        return "args is not an object of arguments"
    for name, desc in args.items():
        if not name.isidentifier() or not isinstance(desc, dict) or not set(desc) <= _ARG_FIELDS:
            return f"args.{name[:40]} is not an argument description"
        v = desc.get("value")
        if not (v is None or type(v) in (bool, int, float, str)):
            return f"args.{name}.value is not a plain value"
        for field_name in ("shape", "strides", "values"):
            seq = desc.get(field_name, [])
            if not isinstance(seq, list) or len(seq) > (1 << 16) or not all(type(x) is int for x in seq):
                return f"args.{name}.{field_name} is not a list of integers"
        if "tensor" in desc and (not isinstance(desc["tensor"], str) or len(desc.get("shape", [])) != len(
                desc.get("strides", []))):
            return f"args.{name} is not a tensor description"
    if not isinstance(grids, dict):
        return "grids is not an object"
    for i, g in grids.items():
        if not i.isdigit() or int(i) not in configs:
            return f"grids names config {i[:20]!r}, not one of that key's configs"
        if not isinstance(g, list) or len(g) != 3 or not all(type(x) is int and 0 <= x < (1 << 31) for x in g):
            return f"grids.{i} is not three grid sizes"
    return ""


def config_to_json(all_kwargs: dict[str, Any]) -> dict[str, Any]:
    """A config's `all_kwargs()` (meta-parameters and num_warps, num_stages, ...) with each value tagged."""
    out = {}
    for name, value in sorted(all_kwargs.items()):
        if not isinstance(name, str) or not name.isidentifier():
            raise UnsupportedArgument(f"config parameter name {name!r}")
        out[name] = list(_json_tag(tag(value)))
    return out


def config_from_json(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict) or not obj or len(obj) > MAX_KEY_VALUES:
        raise ValueError("not a non-empty object of parameters")
    out = {}
    for name, value in obj.items():
        if not name.isidentifier():
            raise ValueError(f"parameter name {name!r:.40} is not an identifier")
        check_tagged(value)
        out[name] = untag(value)
    return out


def config_identity(all_kwargs: dict[str, Any]) -> str:
    """The canonical JSON of a config's tagged form: how a live Config is matched with the bundle's."""
    return canonical_json(config_to_json(all_kwargs)).decode()


def tuning_key_to_json(values: tuple[Any, ...]) -> list[Any]:
    """Triton's tuning key (ints, bools, strings such as 'torch.bfloat16', ...) with each value tagged."""
    return [list(_json_tag(tag(v))) for v in values]


def tuning_key_from_json(obj: Any) -> tuple[Any, ...]:
    if not isinstance(obj, list) or len(obj) > MAX_KEY_VALUES:
        raise ValueError(f"not a list of at most {MAX_KEY_VALUES} values")
    for v in obj:
        check_tagged(v)
    return tuple(untag(v) for v in obj)


def _json_tag(tagged: tuple[str, Any]) -> tuple[str, Any]:
    name, value = tagged
    if name == "tuple":
        return name, [list(_json_tag(v)) for v in value]
    return name, value


def with_winners(autotune_json: dict[str, Any], winners: dict[tuple[Any, ...], int]) -> dict[str, Any]:
    """A copy of `info["autotune"]` with each tuning key's winner (config index) set from `winners`."""
    keys = []
    for k in autotune_json["keys"]:
        values = tuning_key_from_json(k["key"])
        entry = {"key": k["key"], "configs": list(k["configs"])}
        if "call" in k:
            entry["call"] = k["call"]
        winner = winners.get(values, k.get("winner"))
        if winner is not None:
            if winner not in entry["configs"]:
                raise ValueError(f"winner {winner} of tuning key {values!r} is not among its configs {entry['configs']}")
            entry["winner"] = winner
        keys.append(entry)
    return {"configs": list(autotune_json["configs"]), "keys": keys}
