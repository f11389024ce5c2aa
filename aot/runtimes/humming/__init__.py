"""Humming: the MXFP4 MoE kernels vLLM's Humming experts reach, compiled with Humming's own NVRTC path."""
