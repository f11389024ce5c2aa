"""Serving flashinfer kernels from a bundle."""

from nojit.loader.runtimes.flashinfer.face import RUNTIME

__all__ = ["RUNTIME"]
