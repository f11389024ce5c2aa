"""The GPU target every cubin of a bundle is built for: sm_90a (Hopper, compute capability 9.0).

The one home of these numbers on the build side; the Triton and TileLang compilers and the
manifest's target all read them from here.
"""

from __future__ import annotations

from nojit.loader.bundle.manifest import Target

TARGET = Target(backend="cuda", capability=90, arch="sm_90a", warp_size=32)
