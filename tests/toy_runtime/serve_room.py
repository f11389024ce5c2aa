"""The toy runtime's serving face (as loader/runtimes/<runtime>/ exports one): a server on each bundled
kernel's `run` that loads its blob and launches it through nojit's launcher."""

from __future__ import annotations

from typing import Any

from nojit.loader.errors import KernelNotInBundleError
from nojit.loader.faces import Handle, InstallContext, ProcessJit, Runtime
from nojit.loader.launch import cuda_launch

import toy_launch


class ToyServer:
    def __init__(self, kernel_id: str, kernel: Any, ctx: InstallContext) -> None:
        self.kernel_id, self.kernel, self.bundle = kernel_id, kernel, ctx.bundle
        self.entries = {e.key["n"]: e for e in ctx.bundle.entries(kernel_id)}

    def _function(self, entry: Any, device: int) -> Any:
        return cuda_launch.launcher().function(device, entry.blob, lambda: self.bundle.read_blob(entry.blob),
                                               entry.launch.symbol, 0)

    def run(self, n: int) -> int:
        entry = self.entries.get(n)
        if entry is None:
            raise KernelNotInBundleError(self.kernel_id, f"n={n}", self.bundle.path, fix="add n to build_room.SIZES")
        fn = self._function(entry, 0)
        return cuda_launch.launcher().c_launch(fn.function, entry.launch.grid, 1, 1, 32, 1, 1, 0, 0, b"", [], 0)

    def preload(self, device: int) -> int:
        for entry in self.entries.values():
            self._function(entry, device)
        return len(self.entries)


def install(ctx: InstallContext) -> Handle:
    servers = {}
    for kid in ctx.kernel_ids:
        kernel = ctx.resolve(kid)
        server = servers[kid] = ToyServer(kid, kernel, ctx)
        kernel.run = server.run  # instance attribute: this kernel only

    def undo() -> None:
        for server in servers.values():
            server.kernel.__dict__.pop("run", None)

    return Handle(servers, undo=undo)


RUNTIME = Runtime(name="toy", display="Toy", install=install,
                  jits=(ProcessJit("Toy JIT", "toy_kernels", "toy", "the toy kernels"),), launch=toy_launch.RECORD)
