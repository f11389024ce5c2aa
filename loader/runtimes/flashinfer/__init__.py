"""Serving flashinfer kernels from a bundle."""
