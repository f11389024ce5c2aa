"""vLLM general plugin: installs the bundle named by NOJIT_BUNDLE in every vLLM process.

vLLM calls every `vllm.general_plugins` entry point early in each process it starts (API
server, engine core, workers), before models are imported, which is when the loader must
take its place. Without NOJIT_BUNDLE or an installed bundle wheel this does nothing, so installing the nojit wheel
changes no behaviour until an operator points it at a bundle. A bad bundle stops the
process with nojit's own message instead of serving with the JIT behind the operator's back.
"""

from __future__ import annotations

import logging

from nojit.loader.settings import settings

log = logging.getLogger("nojit")


def register() -> None:
    if not settings.bundle:
        from nojit.loader.installed_bundles import installed_bundles

        if not installed_bundles():  # a bundle wheel installed (`nojit package`) counts as configuration
            return
    from nojit.loader.install import install

    install()
