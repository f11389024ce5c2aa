"""The toy runtime's kernels: objects whose own `run` would "JIT-compile" (it raises), as a library's kernel would."""

from __future__ import annotations


class ToyKernel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, n: int) -> object:
        return self.run(n)

    def run(self, n: int) -> object:  # the toy library's JIT: a served kernel never reaches it
        raise RuntimeError(f"toy JIT: would compile {self.name} for n={n}")


scale = ToyKernel("scale")
