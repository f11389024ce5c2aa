"""Serving triton kernels from a bundle."""
