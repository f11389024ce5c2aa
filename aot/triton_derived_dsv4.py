"""Derived keys for DeepSeek-V4 model kernels (see triton_derived for what a row is)."""

from __future__ import annotations

from nojit.aot.triton_derived import DerivedKernel

DSV4_DERIVED: tuple[DerivedKernel, ...] = ()
