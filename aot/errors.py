"""The build side's error: `nojit build` cannot produce a bundle from its inputs.

It lives with the build (the loader never raises it) and is a NoJitError, so the CLI prints
it as one message with its fix, like every loader error.
"""

from __future__ import annotations

from nojit.loader.errors import NoJitError


class BuildError(NoJitError):
    """`nojit build` cannot produce a bundle from its inputs."""
