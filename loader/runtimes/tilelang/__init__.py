"""Serving tilelang kernels from a bundle."""
