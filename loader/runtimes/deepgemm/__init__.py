"""Serving deepgemm kernels from a bundle."""

from nojit.loader.runtimes.deepgemm.face import RUNTIME

__all__ = ["RUNTIME"]
