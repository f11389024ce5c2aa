"""Compile workers on a Ray cluster, behind the concurrent.futures.Executor interface.

`nojit build --ray ADDRESS` runs the same compile task (`build._compile_task`) with the same
worker initializer (deployment platform, offline Triton driver, cache directory) as the
local process pool, in Ray actors instead of local processes: one actor is one worker
process, initialized once, like a ProcessPoolExecutor worker; so the results, and the
bundle, are the same bytes. Every node must have the same nojit, vLLM, Triton (and
TileLang) installed as the machine running `nojit build`; the cache directory is each
node's own.

Ray is optional (`pip install 'nojit[ray]'`); without it `--ray` is a BuildError.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, as_completed
from typing import Any

from nojit.aot.errors import BuildError


class _Worker:
    """A Ray actor body: runs the initializer once, then tasks."""

    def __init__(self, initializer: Callable[..., None] | None, initargs: tuple) -> None:
        if initializer is not None:
            initializer(*initargs)

    def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        return fn(*args, **kwargs)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise BuildError("--ray needs Ray, which is not installed",
                         fix="pip install 'nojit[ray]' (the same Ray version as the cluster's)") from None
    return ray


class RayExecutor:
    """The build's executor (aot/pool.py `Executor`) on the cluster at `address` ("auto", "ray://host:port", ...):
    `jobs` actors, each one worker like a local pool's process."""

    def __init__(self, address: str | None, jobs: int) -> None:
        self.address = address
        self.jobs = max(1, jobs)

    def run(self, task: Callable[..., Any], args: Sequence[tuple[Any, ...]], initializer: Callable[..., None],
            initargs: tuple[Any, ...]) -> Iterator[Any]:
        with _RayActorPool(self.address, min(self.jobs, len(args) or 1), initializer, initargs) as pool:
            futures = [pool.submit(task, *a) for a in args]
            for fut in as_completed(futures):
                yield fut.result()


class _RayActorPool(Executor):
    """`max_workers` Ray actors (one CPU each), behind concurrent.futures' Executor interface."""

    def __init__(self, address: str | None, max_workers: int, initializer: Callable[..., None] | None = None,
                 initargs: tuple = ()) -> None:
        ray = _ray()
        if not ray.is_initialized():
            try:
                ray.init(address=address, log_to_driver=False, logging_level="ERROR")
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise BuildError(f"cannot connect to the Ray cluster at {address}: {exc}",
                                 fix="start it (`ray start --head`) or pass its address to --ray") from None
        actor = ray.remote(num_cpus=1)(_Worker)
        self._actors = [actor.remote(initializer, initargs) for _ in range(max(1, max_workers))]
        self._idle = list(range(len(self._actors)))
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Queued here and given to the next idle actor, as a process pool's workers take tasks."""
        future: Future = Future()
        with self._lock:
            self._queue.append((future, fn, args, kwargs))
        self._dispatch()
        return future

    def _dispatch(self) -> None:
        with self._lock:
            work = []
            while self._idle and self._queue:
                work.append((self._idle.pop(), self._queue.popleft()))
        for i, (future, fn, args, kwargs) in work:
            if not future.set_running_or_notify_cancel():
                self._release(i)
                continue
            self._actors[i].run.remote(fn, args, kwargs).future().add_done_callback(
                lambda remote, i=i, future=future: self._finished(i, future, remote))

    def _finished(self, i: int, future: Future, remote: Future) -> None:
        exc = remote.exception()
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(remote.result())
        self._release(i)

    def _release(self, i: int) -> None:
        with self._lock:
            self._idle.append(i)
        self._dispatch()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        ray = _ray()
        for a in self._actors:
            ray.kill(a)
        self._actors = []
