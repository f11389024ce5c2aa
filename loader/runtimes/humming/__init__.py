"""Serving humming kernels from a bundle."""

from nojit.loader.runtimes.humming.face import RUNTIME

__all__ = ["RUNTIME"]
