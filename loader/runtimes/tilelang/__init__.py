"""Serving tilelang kernels from a bundle."""

from nojit.loader.runtimes.tilelang.face import RUNTIME

__all__ = ["RUNTIME"]
