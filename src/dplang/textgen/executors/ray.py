"""``--executor ray``: Ray Core actors decode the groups (optional extra ``dplang[distributed]``).

Same contract as every executor (:mod:`dplang.textgen.executors.base`): the driver charges the
ledger, keeps the seed and is the only writer; an actor receives chunks of
:class:`~dplang.textgen.executors.base.GroupTask` (prompts and per-group stream states) and returns
the chunk's finished groups. Each call is its own lease holder in the
:class:`~dplang.textgen.executors.base.LeaseTable`: a call that fails (its actor died, was killed,
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

from ..engine import GroupResult, warm_up
from .base import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_STALL_TIMEOUT_S,
    EventHook,
    ExecutorError,
    GroupTask,
    IdentityPin,
    LeaseTable,
    PooledExecutor,
    WorkerRecipe,
    check_identity,
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
        self.model = recipe.model.load()  # a transformers model runs its load-time checks
        self.identity = check_identity(self.model, recipe)
        self.policy = recipe.policy_factory(self.model.vocab_size)
        warm_up()
        self._progress = 0

    def ready(self) -> tuple[int, dict[str, Any]]:
        """This actor's process id and model identity (once its model is loaded and
        checked)."""
        return os.getpid(), self.identity

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
class RayExecutor(PooledExecutor):
    """``workers`` Ray actors, each with its own copy of the model (see the module docstring).

    :meth:`start` connects to Ray and starts the actors, each loading the model and passing
    its checks (identity, row invariance) before it is ready; the driver calls it before it
    charges the ledger (:func:`~dplang.textgen.executors.executor_session`), and :meth:`run`
    calls it if it was not. Each actor has at most two chunk calls in flight, so it starts the
    next chunk as soon as one ends. An actor holding calls whose progress count (read every
    ``stall_timeout_s / 4`` seconds, at most 5 s apart) does not move for ``stall_timeout_s``
    is killed and replaced like one that died."""

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

    def start(self, recipe: WorkerRecipe, groups: int | None = None) -> None:
        """Start the actors (all of ``workers``) and wait until each is ready; raises
        :class:`ExecutorError` when one cannot start."""
        if self._pool is not None and self._pool.recipe is not recipe:
            self.close()
        if self._pool is None:
            self._pool = _RayPool(self, recipe)
            try:
                for n in range(self.workers):
                    self._pool.start_actor(n)
            except BaseException:
                self.close()
                raise



class _RayPool:
    """The actors of one :class:`RayExecutor` run and the driver's side of their calls."""

    def __init__(self, owner: RayExecutor, recipe: WorkerRecipe) -> None:
        try:
            import ray
        except ImportError:
            raise ExecutorError("--executor ray needs Ray: pip install "
                                "'dplang[distributed]'") from None
        self.ray = ray
        self.owner = owner
        self.recipe = recipe
        self.started_here = False
        if not ray.is_initialized():
            ray.init(address=owner.address, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR, configure_logging=False)
            self.started_here = True
        gpu = recipe.model.device == "cuda"
        self.remote = ray.remote(num_gpus=1 if gpu else 0, num_cpus=0 if gpu else 1,
                                 max_restarts=0, max_task_retries=0,
                                 concurrency_groups={_PROBE_GROUP: 1})(_ActorBody)
        self.actors: dict[int, Any] = {}
        self.pids: dict[int, int] = {}
        self.pin = IdentityPin()
        #: call ref -> (actor, call id: the lease holder)
        self.inflight: dict[Any, tuple[int, int]] = {}
        self.probes: dict[Any, int] = {}  # progress probe ref -> actor
        #: actor -> (its last progress count, when it last moved)
        self.progress: dict[int, tuple[int, float]] = {}
        self.probed_at: dict[int, float] = {}
        self.probe_every = min(5.0, owner.stall_timeout_s / 4)
        self.calls = 0
        self.next_number = owner.workers
        self.restarts_left = (owner.max_restarts if owner.max_restarts is not None
                              else 2 * owner.workers + owner.max_retries)
        self.table: LeaseTable | None = None

    def start_actor(self, number: int) -> None:
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        ray = self.ray
        actor = self.remote.remote(self.recipe)
        try:
            pid, identity = ray.get(actor.ready.remote(), timeout=600)
        except (RayActorError, RayTaskError, GetTimeoutError) as exc:
            with contextlib.suppress(Exception):
                ray.kill(actor)
            cause = getattr(exc, "cause", None) or exc
            first = str(cause).strip().splitlines()
            raise ExecutorError(f"Ray worker {number} cannot start: "
                                f"{first[-1] if first else type(cause).__name__}"
                                ) from None
        self.actors[number], self.pids[number] = actor, int(pid)
        try:
            self.pin.check(number, identity, label="Ray worker")
        except ExecutorError:
            with contextlib.suppress(Exception):
                ray.kill(actor)
            del self.actors[number]
            raise
        self.owner._emit("worker_ready", worker=number, pid=int(pid))

    def busy(self, number: int) -> int:
        return sum(1 for a, _ in self.inflight.values() if a == number)

    def moved(self, number: int, count: int | None = None) -> None:
        """Actor ``number`` showed progress now (a new count, a finished call, a first call
        while it held none)."""
        last = self.progress.get(number, (-1, 0.0))[0] if count is None else count
        self.progress[number] = (last, time.monotonic())

    def lose(self, number: int, reason: str) -> None:
        """Actor ``number`` is gone (died, or killed as hung): replace it (once)."""
        if number not in self.actors:
            return
        del self.actors[number]
        for ref in [r for r, n in self.probes.items() if n == number]:
            del self.probes[ref]
        if self.table is not None and self.table.done:
            return
        if self.restarts_left > 0:
            self.restarts_left -= 1
            self.start_actor(self.next_number)
            self.next_number += 1
        elif not self.actors:
            raise ExecutorError(f"every Ray worker failed (last: {reason}); rerun the "
                                "same command to resume")

    def give_back(self, ref: Any, reason: str, event: str = "worker_lost") -> None:
        """A call that will not return: its unreturned groups are requeued."""
        assert self.table is not None
        number, call = self.inflight.pop(ref)
        requeued = self.table.lost(("call", call), reason)
        if event == "worker_lost":
            self.owner._emit(event, worker=number, pid=self.pids.get(number), reason=reason,
                             requeued=requeued)
        else:
            self.owner._emit(event, worker=number, reason=reason, requeued=requeued)

    def kill_stalled(self, number: int) -> None:
        """Kill a hung actor; its calls give their groups back, as for a dead actor."""
        stall = self.owner.stall_timeout_s
        reason = f"Ray worker {number} made no progress for {stall:g} s (hung); it was killed"
        self.owner._emit("worker_stalled", worker=number, pid=self.pids.get(number),
                         seconds=stall)
        with contextlib.suppress(Exception):
            self.ray.kill(self.actors[number], no_restart=True)
        for ref in [r for r, (n, _) in self.inflight.items() if n == number]:
            self.give_back(ref, reason)  # whatever the killed calls might still say is ignored
        self.lose(number, reason)

    def dispatch(self, table: LeaseTable, on_step: Callable[[int], None] | None) -> None:
        from ray.exceptions import RayActorError, RayTaskError

        ray = self.ray
        self.table = table
        while not table.done:
            for number, actor in list(self.actors.items()):
                held = self.busy(number)
                while held < 2 and table.has_work():
                    holder = ("call", self.calls)
                    tasks = table.lease(holder)
                    if not tasks:
                        break
                    if held == 0:  # its progress clock starts with its first call
                        self.moved(number)
                    self.inflight[actor.decode.remote(tasks)] = (number, self.calls)
                    self.owner._emit("leased", worker=number, call=self.calls,
                                     groups=[t.index for t in tasks])
                    self.calls += 1
                    held += 1
            if not self.inflight:
                raise ExecutorError("the Ray executor has nothing in flight and the run "
                                    "is not done")  # pragma: no cover - a table bug
            now = time.monotonic()
            for number, actor in self.actors.items():
                if (self.busy(number) and number not in self.probes.values()
                        and now - self.probed_at.get(number, 0.0) >= self.probe_every):
                    probe = actor.progress.options(concurrency_group=_PROBE_GROUP).remote()
                    self.probes[probe] = number
                    self.probed_at[number] = now
            ready, _ = ray.wait(list(self.inflight) + list(self.probes), num_returns=1,
                                timeout=min(1.0, self.probe_every))
            for ref in ready:
                if ref in self.probes:
                    number = self.probes.pop(ref)
                    with contextlib.suppress(Exception):  # a dead actor: its calls say so
                        count = int(ray.get(ref))
                        if count != self.progress.get(number, (-1, 0.0))[0]:
                            self.moved(number, count)
                    continue
                if ref not in self.inflight:
                    continue
                number, call = self.inflight[ref]
                try:
                    results = ray.get(ref)
                except RayActorError as exc:
                    reason = f"Ray worker {number} died ({type(exc).__name__})"
                    self.give_back(ref, reason)
                    self.lose(number, reason)
                    continue
                except RayTaskError as exc:
                    cause = getattr(exc, "cause", None) or exc
                    self.give_back(ref, f"{type(cause).__name__} in Ray worker {number}",
                                   event="call_failed")
                    continue
                del self.inflight[ref]
                self.moved(number)
                holder = ("call", call)
                for result in results:
                    accepted = table.returned(holder, result)
                    self.owner._emit("result" if accepted else "duplicate_dropped",
                                     worker=number, group=result.index)
                if on_step is not None:
                    on_step(sum(r.num_tokens for r in results))
            now = time.monotonic()
            for number in list(self.actors):
                if (self.busy(number) and now - self.progress.get(number, (0, now))[1]
                        > self.owner.stall_timeout_s):
                    self.kill_stalled(number)

    def close(self) -> None:
        for actor in self.actors.values():
            with contextlib.suppress(Exception):
                self.ray.kill(actor)
        self.actors.clear()
        if self.started_here:
            with contextlib.suppress(Exception):
                self.ray.shutdown()
