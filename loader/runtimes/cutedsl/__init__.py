"""Serving cutedsl kernels from a bundle."""

from nojit.loader.runtimes.cutedsl.face import RUNTIME

__all__ = ["RUNTIME"]
