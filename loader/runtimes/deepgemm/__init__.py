"""Serving deepgemm kernels from a bundle."""
