"""Launching cubins: the CUDA launcher binding and torch's CUDA accessors."""
