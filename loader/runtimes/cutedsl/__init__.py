"""Serving cutedsl kernels from a bundle."""
