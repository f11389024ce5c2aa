"""Run compile tasks in worker processes, behind an executor interface.

The build hands the pool a picklable task function, its per-worker initializer and one
argument tuple per task; results come back in completion order. `LocalProcessExecutor` uses
spawned processes on this machine; another executor (e.g. one spreading tasks over a Ray
cluster) only has to implement `Executor.run`.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Protocol

Task = Callable[..., Any]


class Executor(Protocol):
    def run(self, task: Task, args: Sequence[tuple[Any, ...]], initializer: Callable[..., None],
            initargs: tuple[Any, ...]) -> Iterator[Any]:
        """Call `task(*a)` for every `a` in `args`, each worker first running `initializer(*initargs)`;
        yield the results as they complete."""
        ...


class LocalProcessExecutor:
    """`jobs` spawned worker processes on this machine (spawn: each imports only what it compiles)."""

    def __init__(self, jobs: int) -> None:
        self.jobs = max(1, jobs)

    def run(self, task: Task, args: Sequence[tuple[Any, ...]], initializer: Callable[..., None],
            initargs: tuple[Any, ...]) -> Iterator[Any]:
        ctx = multiprocessing.get_context("spawn")
        jobs = max(1, min(self.jobs, len(args) or 1))
        with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=initializer, initargs=initargs) as pool:
            futures = [pool.submit(task, *a) for a in args]
            for fut in as_completed(futures):
                yield fut.result()
