"""Run by tests/loader/runtimes/triton/test_source_parts.py in a fresh process: the recorded-parts source check against Triton's
cache_key on real vLLM kernels, each change made the way the source would differ in a serving process.

Prints one JSON line per case: {case, proven (the parts check), live_equal (Triton's cache_key equals the
build's), refused (check_source, as prepare calls it, raised), cache_key_calls}.
"""

from __future__ import annotations

import json
import sys

from nojit.aot.vllm_env import PlatformFacts, install_deployment_platform

install_deployment_platform(PlatformFacts())

import importlib

from nojit.aot.runtimes.triton.source_parts import source_parts
from nojit.loader.errors import BundleMismatchError
from nojit.loader.runtimes.triton.source_parts import unchanged_since_build
from nojit.loader.bundle.versions import check_source
from triton.runtime.jit import JITCallable

GUMBEL = "vllm.v1.worker.gpu.sample.gumbel"
KERNEL = f"{GUMBEL}:_gumbel_sample_kernel"  # calls gumbel_noised_argmax, which reads the constexpr _DRAFT_NOISE_SALT
REJECTION = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils:_rejection_kernel"  # reaches gumbel's tl_rand32

calls = [0]
_real = JITCallable.cache_key.fget


def _counted(self):
    calls[0] += 1
    return _real(self)


def obj(kid: str):
    module, _, qualname = kid.partition(":")
    o = importlib.import_module(module)
    for part in qualname.split("."):
        o = getattr(o, part)
    return o


def functions(parts) -> list:
    return [obj(name) for name in parts["fns"]]


def forget(parts) -> None:
    """Triton computes a key once per function object: forget every key so each case starts fresh."""
    for f in functions(parts):
        f.hash = None


def case(name: str, kid: str, parts, bundle_hash: str | None = None) -> None:
    """`bundle_hash`: the kernel's hash in the bundle (default: the one the record was made for)."""
    bundle_hash = bundle_hash or parts["key"]
    fn = obj(kid)
    forget(parts)
    calls[0] = 0
    proven = unchanged_since_build(fn, parts, bundle_hash)
    fast_calls = calls[0]
    refused = False
    if not proven:
        try:
            check_source(kid, bundle_hash, fn.cache_key, "b.nojit", frozenset())
        except BundleMismatchError:
            refused = True
    forget(parts)
    live_equal = fn.cache_key == bundle_hash
    print(json.dumps({"case": name, "kernel": kid, "proven": proven, "live_equal": live_equal, "refused": refused,
                      "cache_key_calls": fast_calls}))


def main() -> None:
    records = {kid: source_parts(obj(kid)) for kid in (KERNEL, REJECTION)}
    JITCallable.cache_key = property(_counted)
    gumbel = importlib.import_module(GUMBEL)
    for kid, parts in records.items():
        case("unchanged", kid, parts)

    kernel_fn = obj(KERNEL)
    src = kernel_fn.src
    kernel_fn._unsafe_update_src(src.replace("):", "):\n    pass", 1))  # the kernel's own source
    case("kernel source", KERNEL, records[KERNEL])
    kernel_fn._unsafe_update_src(src)
    case("kernel source restored", KERNEL, records[KERNEL])

    line = kernel_fn.starting_line_number
    kernel_fn.starting_line_number = line + 1  # a line added above the kernel
    case("kernel starting line", KERNEL, records[KERNEL])
    kernel_fn.starting_line_number = line

    dep = gumbel.gumbel_noised_argmax  # a @triton.jit helper the kernel calls
    dep_src = dep.src
    dep._unsafe_update_src(dep_src + "\n")
    case("dependency source", KERNEL, records[KERNEL])
    dep._unsafe_update_src(dep_src)

    noinline = dep.noinline
    dep.noinline = not noinline
    case("dependency noinline", KERNEL, records[KERNEL])
    dep.noinline = noinline

    other = gumbel._log1p_neg_stable  # the name of one helper bound to another @triton.jit function
    gumbel.gumbel_noised_argmax = other
    case("dependency rebound", KERNEL, records[KERNEL])
    gumbel.gumbel_noised_argmax = dep

    salt = gumbel._DRAFT_NOISE_SALT  # a constexpr global read by the helper
    gumbel._DRAFT_NOISE_SALT = type(salt)(salt.value + 1)
    case("constexpr global", KERNEL, records[KERNEL])
    gumbel._DRAFT_NOISE_SALT = type(salt)(salt.value)
    case("constexpr global, same value", KERNEL, records[KERNEL])
    gumbel._DRAFT_NOISE_SALT = salt

    rmin = gumbel._TL_RAND_MIN  # a constexpr global two modules away (rejection kernel -> gumbel's tl_rand32)
    gumbel._TL_RAND_MIN = type(rmin)(rmin.value * 2)
    case("constexpr global of another module", REJECTION, records[REJECTION])
    gumbel._TL_RAND_MIN = rmin
    case("all restored", REJECTION, records[REJECTION])

    stale = dict(records[KERNEL], triton="0.0.0")  # a record made by another Triton: not used
    case("record of another triton", KERNEL, stale)
    older = dict(records[KERNEL], key="0" * 64)  # the bundle's hash is not the one the record proves
    case("record for another hash", KERNEL, older, records[KERNEL]["key"])


if __name__ == "__main__":
    main()
    sys.stdout.flush()
