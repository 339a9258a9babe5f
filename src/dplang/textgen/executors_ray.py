"""``--executor ray``: Ray Core actors decode the groups (optional extra ``dplang[distributed]``).

Same contract as every executor (:mod:`dplang.textgen.executors`): the driver charges the
ledger, keeps the seed and is the only writer; an actor receives chunks of
:class:`~dplang.textgen.executors.GroupTask` (prompts and per-group stream states) and returns
the chunk's finished groups. Each call is its own lease holder in the
:class:`~dplang.textgen.executors.LeaseTable`: a call that fails (its actor died, was killed,
ran out of memory, or raised) gives back exactly its own unreturned groups, which are
requeued; a group that keeps failing stops the run. Dead actors are replaced by new ones
(Ray's own actor restarts are not used: a restarted actor would re-run calls the table has
already requeued).

``address=None`` starts a local Ray instance for the run (and stops it afterwards) unless the
process is already connected to one; ``--ray-address`` joins a running cluster. Actors ask
Ray for one GPU each when the model runs on CUDA, else one CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..models.base import LogitsModel
from .engine import GroupResult
from .executors import (
    DEFAULT_MAX_RETRIES,
    EventHook,
    ExecutorError,
    GroupTask,
    LeaseTable,
    WorkerRecipe,
    check_identity,
    decode_tasks,
)

__all__ = ["RayExecutor"]


class _ActorBody:
    """A Ray actor's state: the model and the policy factory, loaded once."""

    def __init__(self, recipe: WorkerRecipe) -> None:
        self.recipe = recipe
        self.model = recipe.model.load()
        check_identity(self.model, recipe)
        self.policy = recipe.policy_factory(self.model.vocab_size)

    def ready(self) -> int:
        """This actor's process id (once its model is loaded and checked)."""
        return os.getpid()

    def decode(self, tasks: list[GroupTask]) -> list[GroupResult]:
        """Decode a chunk; the results in completion order."""
        out: list[GroupResult] = []
        decode_tasks(self.model, self.recipe, tasks, out.append, policy=self.policy)
        return out


@dataclass
class RayExecutor:
    """``workers`` Ray actors, each with its own copy of the model (see the module docstring).

    Each actor has at most two chunk calls in flight, so it starts the next chunk as soon as
    one ends."""

    workers: int = 2
    address: str | None = None
    chunk_size: int | None = None
    max_retries: int = DEFAULT_MAX_RETRIES
    events: EventHook | None = None
    name: str = "ray"
    #: Replacement actors that may be started in all (default: 2 × workers + retries).
    max_restarts: int | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")

    def _emit(self, name: str, **fields: Any) -> None:
        if self.events is not None:
            self.events(name, fields)

    def run(self, model: LogitsModel, recipe: WorkerRecipe, table: LeaseTable,
            on_step: Callable[[int], None] | None) -> None:
        try:
            import ray
            from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
        except ImportError:
            raise ExecutorError("--executor ray needs Ray: pip install "
                                "'dplang[distributed]'") from None
        started_here = False
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR, configure_logging=False)
            started_here = True
        gpu = recipe.model.device == "cuda"
        remote = ray.remote(num_gpus=1 if gpu else 0, num_cpus=0 if gpu else 1,
                            max_restarts=0, max_task_retries=0)(_ActorBody)
        actors: dict[int, Any] = {}
        pids: dict[int, int] = {}
        inflight: dict[Any, tuple[int, int]] = {}  # ref -> (actor, call id: the lease holder)
        calls = 0
        restarts_left = (self.max_restarts if self.max_restarts is not None
                         else 2 * self.workers + self.max_retries)

        def start(number: int) -> None:
            actor = remote.remote(recipe)
            try:
                pid = ray.get(actor.ready.remote(), timeout=600)
            except (RayActorError, RayTaskError, GetTimeoutError) as exc:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
                cause = getattr(exc, "cause", None) or exc
                first = str(cause).strip().splitlines()
                raise ExecutorError(f"Ray worker {number} cannot start: "
                                    f"{first[-1] if first else type(cause).__name__}"
                                    ) from None
            actors[number], pids[number] = actor, int(pid)
            self._emit("worker_ready", worker=number, pid=int(pid))

        try:
            for n in range(self.workers):
                start(n)
            next_number = self.workers
            while not table.done:
                for number, actor in list(actors.items()):
                    busy = sum(1 for a, _ in inflight.values() if a == number)
                    while busy < 2 and table.has_work():
                        holder = ("call", calls)
                        tasks = table.lease(holder)
                        if not tasks:
                            break
                        inflight[actor.decode.remote(tasks)] = (number, calls)
                        self._emit("leased", worker=number, call=calls,
                                   groups=[t.index for t in tasks])
                        calls += 1
                        busy += 1
                if not inflight:
                    raise ExecutorError("the Ray executor has nothing in flight and the run "
                                        "is not done")  # pragma: no cover - a table bug
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=1.0)
                for ref in ready:
                    number, call = inflight.pop(ref)
                    holder = ("call", call)
                    try:
                        results = ray.get(ref)
                    except RayActorError as exc:
                        reason = f"Ray worker {number} died ({type(exc).__name__})"
                        requeued = table.lost(holder, reason)
                        self._emit("worker_lost", worker=number, pid=pids.get(number),
                                   reason=reason, requeued=requeued)
                        if number in actors:
                            del actors[number]
                            if not table.done and restarts_left > 0:
                                restarts_left -= 1
                                start(next_number)
                                next_number += 1
                            elif not actors:
                                raise ExecutorError(f"every Ray worker failed (last: {reason})"
                                                    "; rerun the same command to resume"
                                                    ) from None
                        continue
                    except RayTaskError as exc:
                        cause = getattr(exc, "cause", None) or exc
                        reason = f"{type(cause).__name__} in Ray worker {number}"
                        requeued = table.lost(holder, reason)
                        self._emit("call_failed", worker=number, reason=reason,
                                   requeued=requeued)
                        continue
                    for result in results:
                        accepted = table.returned(holder, result)
                        self._emit("result" if accepted else "duplicate_dropped",
                                   worker=number, group=result.index)
                    if on_step is not None:
                        on_step(sum(r.num_tokens for r in results))
        finally:
            for actor in actors.values():
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            if started_here:
                with contextlib.suppress(Exception):
                    ray.shutdown()
