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

Hung actors: a chunk call returns whole, so each actor also counts its decode steps and
finished groups, and the driver reads that count through a ``progress`` method in a
concurrency group of its own (answered while a chunk is decoding). An actor that holds calls
and whose count has not moved for ``stall_timeout_s`` (or that does not answer) is hung: it is
``ray.kill``-ed and handled exactly like an actor that died (its calls' groups requeued and
counted as retries, a replacement started).

``address=None`` starts a local Ray instance for the run (and stops it afterwards) unless the
process is already connected to one; ``--ray-address`` joins a running cluster. Actors ask
Ray for one GPU each when the model runs on CUDA, else one CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..models.base import LogitsModel
from .engine import GroupResult
from .executors import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_STALL_TIMEOUT_S,
    EventHook,
    ExecutorError,
    GroupTask,
    LeaseTable,
    WorkerRecipe,
    check_identity,
    check_stall_timeout,
    decode_tasks,
)

__all__ = ["RayExecutor"]


#: The concurrency group of :meth:`_ActorBody.progress` (its own thread: it answers while a
#: chunk is decoding in the default group).
_PROBE_GROUP = "progress"


class _ActorBody:
    """A Ray actor's state: the model and the policy factory, loaded once."""

    def __init__(self, recipe: WorkerRecipe) -> None:
        self.recipe = recipe
        self.model = recipe.model.load()
        check_identity(self.model, recipe)
        self.policy = recipe.policy_factory(self.model.vocab_size)
        self._progress = 0

    def ready(self) -> int:
        """This actor's process id (once its model is loaded and checked)."""
        return os.getpid()

    def progress(self) -> int:
        """Decode steps plus finished groups so far (public: counts only)."""
        return self._progress

    def decode(self, tasks: list[GroupTask]) -> list[GroupResult]:
        """Decode a chunk; the results in completion order."""
        out: list[GroupResult] = []

        def on_step(_rows: int) -> None:
            self._progress += 1

        def on_result(result: GroupResult) -> None:
            out.append(result)
            self._progress += 1

        decode_tasks(self.model, self.recipe, tasks, on_result, on_step, policy=self.policy)
        return out


@dataclass
class RayExecutor:
    """``workers`` Ray actors, each with its own copy of the model (see the module docstring).

    Each actor has at most two chunk calls in flight, so it starts the next chunk as soon as
    one ends. An actor holding calls whose progress count (read every ``stall_timeout_s / 4``
    seconds, at most 5 s apart) does not move for ``stall_timeout_s`` is killed and replaced
    like one that died."""

    workers: int = 2
    address: str | None = None
    chunk_size: int | None = None
    max_retries: int = DEFAULT_MAX_RETRIES
    events: EventHook | None = None
    name: str = "ray"
    #: Replacement actors that may be started in all (default: 2 × workers + retries).
    max_restarts: int | None = None
    #: Seconds an actor holding calls may show no progress before it is declared hung.
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        check_stall_timeout(self.stall_timeout_s)

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
                            max_restarts=0, max_task_retries=0,
                            concurrency_groups={_PROBE_GROUP: 1})(_ActorBody)
        actors: dict[int, Any] = {}
        pids: dict[int, int] = {}
        inflight: dict[Any, tuple[int, int]] = {}  # ref -> (actor, call id: the lease holder)
        probes: dict[Any, int] = {}  # progress probe ref -> actor
        progress: dict[int, tuple[int, float]] = {}  # actor -> (its count, when it last moved)
        probed_at: dict[int, float] = {}
        probe_every = min(5.0, self.stall_timeout_s / 4)
        calls = 0
        next_number = self.workers
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

        def busy(number: int) -> int:
            return sum(1 for a, _ in inflight.values() if a == number)

        def moved(number: int, count: int | None = None) -> None:
            """Actor ``number`` showed progress now (a new count, a finished call, a first
            call while it held none)."""
            last = progress.get(number, (-1, 0.0))[0] if count is None else count
            progress[number] = (last, time.monotonic())

        def lose(number: int, reason: str) -> None:
            """Actor ``number`` is gone (died, or killed as hung): replace it (once)."""
            nonlocal next_number, restarts_left
            if number not in actors:
                return
            del actors[number]
            for ref in [r for r, n in probes.items() if n == number]:
                del probes[ref]
            if table.done:
                return
            if restarts_left > 0:
                restarts_left -= 1
                start(next_number)
                next_number += 1
            elif not actors:
                raise ExecutorError(f"every Ray worker failed (last: {reason}); rerun the "
                                    "same command to resume") from None

        def give_back(ref: Any, reason: str, event: str = "worker_lost") -> None:
            number, call = inflight.pop(ref)
            requeued = table.lost(("call", call), reason)
            if event == "worker_lost":
                self._emit(event, worker=number, pid=pids.get(number), reason=reason,
                           requeued=requeued)
            else:
                self._emit(event, worker=number, reason=reason, requeued=requeued)

        def kill_stalled(number: int) -> None:
            """Kill a hung actor; its calls give their groups back, as for a dead actor."""
            reason = (f"Ray worker {number} made no progress for {self.stall_timeout_s:g} s "
                      "(hung); it was killed")
            self._emit("worker_stalled", worker=number, pid=pids.get(number),
                       seconds=self.stall_timeout_s)
            with contextlib.suppress(Exception):
                ray.kill(actors[number], no_restart=True)
            for ref in [r for r, (n, _) in inflight.items() if n == number]:
                give_back(ref, reason)  # whatever the killed calls might still say is ignored
            lose(number, reason)

        try:
            for n in range(self.workers):
                start(n)
            while not table.done:
                for number, actor in list(actors.items()):
                    held = busy(number)
                    while held < 2 and table.has_work():
                        holder = ("call", calls)
                        tasks = table.lease(holder)
                        if not tasks:
                            break
                        if held == 0:  # its progress clock starts with its first call
                            moved(number)
                        inflight[actor.decode.remote(tasks)] = (number, calls)
                        self._emit("leased", worker=number, call=calls,
                                   groups=[t.index for t in tasks])
                        calls += 1
                        held += 1
                if not inflight:
                    raise ExecutorError("the Ray executor has nothing in flight and the run "
                                        "is not done")  # pragma: no cover - a table bug
                now = time.monotonic()
                for number, actor in actors.items():
                    if (busy(number) and number not in probes.values()
                            and now - probed_at.get(number, 0.0) >= probe_every):
                        probes[actor.progress.options(
                            concurrency_group=_PROBE_GROUP).remote()] = number
                        probed_at[number] = now
                ready, _ = ray.wait(list(inflight) + list(probes), num_returns=1,
                                    timeout=min(1.0, probe_every))
                for ref in ready:
                    if ref in probes:
                        number = probes.pop(ref)
                        with contextlib.suppress(Exception):  # a dead actor: its calls say so
                            count = int(ray.get(ref))
                            if count != progress.get(number, (-1, 0.0))[0]:
                                moved(number, count)
                        continue
                    if ref not in inflight:
                        continue
                    number, call = inflight[ref]
                    try:
                        results = ray.get(ref)
                    except RayActorError as exc:
                        reason = f"Ray worker {number} died ({type(exc).__name__})"
                        give_back(ref, reason)
                        lose(number, reason)
                        continue
                    except RayTaskError as exc:
                        cause = getattr(exc, "cause", None) or exc
                        give_back(ref, f"{type(cause).__name__} in Ray worker {number}",
                                  event="call_failed")
                        continue
                    del inflight[ref]
                    moved(number)
                    holder = ("call", call)
                    for result in results:
                        accepted = table.returned(holder, result)
                        self._emit("result" if accepted else "duplicate_dropped",
                                   worker=number, group=result.index)
                    if on_step is not None:
                        on_step(sum(r.num_tokens for r in results))
                now = time.monotonic()
                for number in list(actors):
                    if (busy(number) and now - progress.get(number, (0, now))[1]
                            > self.stall_timeout_s):
                        kill_stalled(number)
        finally:
            for actor in actors.values():
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            if started_here:
                with contextlib.suppress(Exception):
                    ray.shutdown()
