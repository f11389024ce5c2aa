"""vLLM's model runners (V2 and V1): the rows every model served through them shares.

A model room gives its KV-cache groups (KVCacheGroup, as vLLM's KV-cache config would list them) and takes:
owners.py   runner_owners(kv_groups): the registered warmup owners of the runners
derived.py  runner_derived(kv_groups): keys derived from the runners' unregistered launch sites
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nojit.aot.deployment import Deployment


@dataclass(frozen=True)
class KVCacheGroup:
    """One KV-cache group of a deployment, as the runners' block tables see it."""

    block_size: int  # tokens per block (the group's spec.block_size)
    sliding_window: bool  # a SlidingWindowSpec keeping tokens (num_retained_tokens > 0): its block table is masked
    mamba: bool = False  # a MambaSpec group (GDN, Mamba2) in prefix caching's "align" mode: the runners migrate its state
    speculative_blocks: int = 0  # MambaSpec.num_speculative_blocks (extra state blocks for spec decode)


KVGroups = Callable[[Deployment], tuple[KVCacheGroup, ...]]  # the groups of a deployment, in vLLM's order
