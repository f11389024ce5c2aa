"""Serving FlashInfer's CuTeDSL kernels (its cached_compile cache) from a bundle."""

from nojit.loader.runtimes.flashinfer_cute.face import RUNTIME

__all__ = ["RUNTIME"]
