"""Serving triton kernels from a bundle."""

from nojit.loader.runtimes.triton.face import RUNTIME

__all__ = ["RUNTIME"]
