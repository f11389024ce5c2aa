"""vLLM general plugin: installs the bundle named by NOJIT_BUNDLE in every vLLM process.

vLLM calls every `vllm.general_plugins` entry point once per process (vllm/plugins/__init__.py
`load_general_plugins`): in the API server while it parses the engine arguments
(engine/arg_utils.py), in the engine core before its executor exists (v1/engine/core.py), and
in each worker in `init_worker` before the worker class, the device and the model
(v1/worker/worker_base.py), which is when the loader must take its place. A process started
with fork (vLLM's default) has its parent's plugins already loaded and inherits the
installation, the hooks and the firewall's environment; a spawned one runs this again.

Here, in order: install the bundle (nojit.loader.install: versions, kernel servers, strict
guards and firewall), route vLLM's JIT warmup registry through the bundle (vllm_registry:
Triton's driver answered without a C compiler, strict preflight, preload before CUDA-graph
capture), print one line saying what this process serves, and in strict mode one block
saying which JITs nojit does not serve yet that this process can reach (unserved). Without
NOJIT_BUNDLE or an installed bundle wheel (`nojit package`) this does nothing, so installing the nojit wheel changes no behaviour until an
operator points it at a bundle. A bad bundle stops the process with nojit's own message
instead of serving with the JIT behind the operator's back.
"""

from __future__ import annotations

import sys

from nojit.loader.announce import announce
from nojit.loader.settings import settings


def register() -> None:
    if not settings.bundle:
        from nojit.loader.bundle.installed import installed_bundles

        if not installed_bundles():  # a bundle wheel installed (`nojit package`) counts as configuration
            return
    from nojit.loader import vllm_registry
    from nojit.loader.install import install

    inst = install()
    if "triton" in sys.modules:  # from now on Triton's driver questions are answered without building cuda_utils
        from nojit.loader.runtimes.triton.driver import answer_from_torch

        answer_from_torch()
    vllm_registry.hook()
    announce(inst)
