"""Every nojit setting, read from the environment in one place, typed.

Modelled on Triton's knobs: each setting is a descriptor that reads its variable when
asked, so tests can change the environment (or use `scope`) without reloading modules.
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Iterator
from typing import Generic, TypeVar

from nojit.loader.errors import BundleError, NoJitError

T = TypeVar("T")

# The one table of tool-version policy: each producer fact the loader compares with this process (versions.py),
# named by the word NOJIT_ALLOW_MISMATCH takes to serve a bundle anyway, with the installed distributions whose
# versions it compares (none: a fact that is not a package version).
TOOL_FACTS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm",),  # where the kernels' sources came from
    "triton": ("triton",),  # compiled the Triton cubins (their launch ABI, their key rules)
    "tilelang": ("tilelang",),  # compiled the TileLang cubins (compared where it is installed)
    "cutedsl": ("nvidia-cutlass-dsl", "apache-tvm-ffi", "quack-kernels"),  # wrote and traced the CuTeDSL objects, loads them
    "flashinfer_cute": ("nvidia-cutlass-dsl", "apache-tvm-ffi", "flashinfer-python"),  # traced and wrote FlashInfer's CuTeDSL kernels (their wrappers are FlashInfer's), loads them
    "arch": (),  # the GPU's compute capability
    "source": (),  # a kernel's source hash
}
MISMATCH_FACTS = tuple(TOOL_FACTS)  # the words NOJIT_ALLOW_MISMATCH accepts


class Mode(str, enum.Enum):
    """What the loader does when the bundle has no entry for a requested key."""

    STRICT = "strict"  # raise KernelNotInBundleError; any compile attempt raises
    PERMISSIVE = "permissive"  # fall back to the JIT, with a warning naming the key
    RECORD = "record"  # like permissive, and append every requested key to a file


class _EnvSetting(Generic[T]):
    def __init__(self, name: str, default: T, doc: str) -> None:
        self.name = name
        self.default = default
        self.__doc__ = doc

    def parse(self, raw: str) -> T:
        raise NotImplementedError

    def __get__(self, obj: object, objtype: type | None = None) -> T:
        if obj is None:  # Settings.name: the setting itself (its parse, its doc)
            return self  # type: ignore[return-value]
        raw = os.environ.get(self.name)
        if raw is None or raw == "":
            return self.default
        return self.parse(raw)


class _Str(_EnvSetting[str]):
    def parse(self, raw: str) -> str:
        return raw


class _OptionalPath(_EnvSetting["str | None"]):
    def parse(self, raw: str) -> str | None:
        return os.path.expanduser(raw)


class _Sha256(_EnvSetting["str | None"]):
    """A pinned sha256: unset is no pin; set, it must be 64 hex digits (set but empty is an error, never "unset",
    so a deployment that meant to pin and lost the value does not run unpinned)."""

    def __get__(self, obj: object, objtype: type | None = None) -> str | None:  # type: ignore[override]
        if obj is None:
            return self  # type: ignore[return-value]
        raw = os.environ.get(self.name)
        return None if raw is None else self.parse(raw)

    def parse(self, raw: str) -> str:
        value = raw.strip().lower()
        if len(value) != 64 or not set(value) <= set("0123456789abcdef"):
            what = "set but empty" if not value else f"{raw!r:.80} is not a sha256 hex digest"
            raise BundleError(f"{self.name} is {what}" if not value else f"{self.name}={what}",
                              fix=f"set {self.name} to the 64 hex digits `sha256sum` prints for the deployed bundle, "
                              "or unset it to serve without a pin")
        return value


class _Bool(_EnvSetting[bool]):
    def parse(self, raw: str) -> bool:
        value = raw.strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise NoJitError(f"{self.name}={raw!r} is not a boolean", fix=f"set {self.name} to 1 or 0")


class _Mode(_EnvSetting[Mode]):
    def parse(self, raw: str) -> Mode:
        try:
            return Mode(raw.strip().lower())
        except ValueError:
            choices = ", ".join(m.value for m in Mode)
            raise NoJitError(f"NOJIT_MODE={raw!r} is not a mode", fix=f"set NOJIT_MODE to one of: {choices}") from None


class _Choices(_EnvSetting[frozenset]):
    """A comma-separated set of known words, case-insensitive; an unknown word is an error, never ignored."""

    def __init__(self, name: str, default: frozenset, doc: str, choices: tuple[str, ...]) -> None:
        super().__init__(name, default, doc)
        self.choices = choices

    def parse(self, raw: str) -> frozenset:
        words = frozenset(part.strip().lower() for part in raw.split(",") if part.strip())
        unknown = sorted(words - set(self.choices))
        if unknown:
            raise NoJitError(f"{self.name}={raw!r}: {', '.join(map(repr, unknown))} is not one of {', '.join(self.choices)}",
                             fix=f"list only these words, comma-separated (e.g. {self.name}={self.choices[0]}); "
                             "there is no 'all': name each difference you accept")
        return words


class Settings:
    """The environment variables nojit reads."""

    bundle = _OptionalPath("NOJIT_BUNDLE", None, "Path of the bundle the loader serves kernels from.")
    mode = _Mode("NOJIT_MODE", Mode.STRICT, "strict | permissive | record (see Mode).")
    record_file = _OptionalPath(
        "NOJIT_RECORD_FILE", None, "Where record mode appends requested keys (default: <bundle>.keys.jsonl)."
    )
    allow_mismatch = _Choices(
        "NOJIT_ALLOW_MISMATCH",
        frozenset(),
        "Comma-separated producer facts the loader may ignore when they differ: "
        f"{', '.join(MISMATCH_FACTS)} (case-insensitive; any other word is an error). "
        "Default: none (refuse any mismatch).",
        MISMATCH_FACTS,
    )
    bundle_sha256 = _Sha256(
        "NOJIT_BUNDLE_SHA256", None,
        "sha256 the bundle file must have; checked before anything in it is parsed (set but empty is an error)."
    )
    event_log = _OptionalPath(
        "NOJIT_EVENT_LOG", None,
        "JSONL file strict mode appends one line to per refused compiler (default: <runtime dir>/events.jsonl, "
        "see loader/strict/firewall.py).",
    )
    quiet = _Bool("NOJIT_QUIET", False, "Suppress the one-line summary the loader logs at install.")
    fast_path = _Bool("NOJIT_FAST_PATH", True,
                      "Launch exact Triton entries and TileLang variants with one C call (off: the Python path only).")
    dlpack = _Bool("NOJIT_DLPACK", True,
                   "The C launch path reads tensors and torch's current stream through torch's DLPack C exchange API "
                   "where torch has one (off: through torch's Python API).")
    landlock = _Bool("NOJIT_LANDLOCK", True,
                     "Strict mode restricts execution with Linux Landlock: no compiler can be executed by this process "
                     "or its children (loader/strict/landlock.py). Off: the audit hook and the PATH stand-ins only.")
    unreadable_ptx_jit = _Bool("NOJIT_UNREADABLE_PTX_JIT", False,
                               "Strict mode with Landlock also makes the driver's PTX JIT library "
                               "(libnvidia-ptxjitcompiler) unreadable to the process tree, so no process of it, one "
                               "that never installs nojit included, can JIT-compile PTX (loader/strict/driver_jit.py). "
                               "Off until shown on the GPU that CUDA starts without it.")
    exec_allow = _Str("NOJIT_EXEC_ALLOW", None,
                      "Extra folders (os.pathsep-separated) whose files strict mode's exec allow-list lets run, "
                      "compilers excepted; each must be writable by no other user.")


settings = Settings()


def _set(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@contextlib.contextmanager
def scope(**values: str | None) -> Iterator[None]:
    """Temporarily set (or, with None, unset) environment variables: `scope(NOJIT_MODE="record")`."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            _set(name, value)
        yield
    finally:
        for name, value in saved.items():
            _set(name, value)
