"""Serving humming kernels from a bundle."""
