"""Strict mode: the compiler firewall, the in-process guards and the recorded toolchain."""
