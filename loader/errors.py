"""Typed errors, each naming the thing that is wrong and what to do about it.

Every failure nojit reports to an operator is one of these. The message says what (the
file, the kernel, the key, the version) and `fix` says what to do next, so nothing surfaces
as a traceback from deep inside Triton, TileLang or the driver.
"""

from __future__ import annotations


class NoJitError(Exception):
    """Base class: a message plus the fix an operator should apply."""

    def __init__(self, message: str, fix: str = "") -> None:
        self.message = message
        self.fix = fix
        super().__init__(f"{message}\n  fix: {fix}" if fix else message)


class BundleError(NoJitError):
    """The bundle file cannot be used."""


class BundleCorruptError(BundleError):
    """The bundle is truncated, damaged, or not a nojit bundle at all."""


class BundleMismatchError(BundleError):
    """The bundle was built for other versions, another GPU, or other kernel source."""


class KernelNotInBundleError(NoJitError):
    """Strict mode: the serving process asked for a kernel specialization the bundle lacks."""

    def __init__(self, kernel: str, key: str, bundle: str, fix: str) -> None:
        self.kernel = kernel
        self.key = key
        self.bundle = bundle
        super().__init__(f"kernel {kernel} has no entry for key {key} in bundle {bundle}", fix)


class CompileForbiddenError(NoJitError):
    """Strict mode: something tried to run a compiler (Triton, TileLang, ptxas, a host C compiler)."""


class LaunchError(NoJitError):
    """The CUDA driver refused to load or launch a bundled kernel."""


class PreflightError(NoJitError):
    """Strict mode: vLLM's warmup registry declares keys the bundle does not serve (all listed at once)."""


class UnsafePathError(NoJitError):
    """A folder or file nojit writes, or a library then loads by path, could be changed by another user
    (not ours, writable by others, a symlink, not a regular file): refused, naming the path."""


class UnavailableAttributeError(NoJitError, AttributeError):
    """A name of a library nojit stands in for: an AttributeError too, so `hasattr` and `getattr(x, n, default)`
    probes of the stand-in answer "absent" as Python code expects, instead of raising out of the caller."""

