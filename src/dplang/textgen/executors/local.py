"""``--executor local``: ``N`` spawned worker processes on this machine, each with its own copy
of the model, and the driver's side of their pipe protocol.

Same contract as every executor (:mod:`dplang.textgen.executors.base`): the driver charges the
ledger, keeps the seed and is the only writer; a worker receives chunks of
:class:`~dplang.textgen.executors.base.GroupTask` and sends back finished groups. A worker that
dies or hangs is replaced and its unreturned groups are requeued (:class:`LocalExecutor`).

Size: the worker's loop, the driver's sender threads and the pool are one protocol (messages
``ready``, ``steps``, ``result``, ``fatal``, ``error``) and are read together.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
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

__all__ = ["LocalExecutor"]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    if text and isinstance(exc, ExecutorError):
        return text[0]
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _worker_main(conn: Connection, recipe: WorkerRecipe, number: int = 0) -> None:
    """A ``local`` worker: load the model, check its identity, then decode the chunks the
    driver sends and send back each finished group. On CUDA, worker ``number`` uses GPU
    ``number mod count`` (one process per device; the device *type* is the run's identity).

    It never writes a file. It exits as soon as the driver's end of the pipe closes (the driver
    finished, stopped or was killed), so a killed driver leaves no worker decoding behind."""
    inbox: queue.Queue[Any] = queue.Queue()

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the driver is gone: stop at once, mid-step included
            if message is None:
                os._exit(0)
            inbox.put(message)

    def send(message: Any) -> None:
        try:
            conn.send(message)
        except (OSError, EOFError, ValueError):
            os._exit(0)  # the driver is gone (or done with this worker)

    threading.Thread(target=read, daemon=True).start()
    try:
        if recipe.model.device == "cuda":
            import torch

            torch.cuda.set_device(number % max(1, torch.cuda.device_count()))
        model = recipe.model.load()  # a transformers model runs its load-time checks here
        identity = check_identity(model, recipe)
        policy = recipe.policy_factory(model.vocab_size)
        warm_up()
    except Exception as exc:
        send(("fatal", _one_line(exc)))
        return
    send(("ready", os.getpid(), identity))
    steps = 0
    last = time.monotonic()

    def on_step(n: int) -> None:
        nonlocal steps, last
        steps += n
        if time.monotonic() - last > 0.2:
            send(("steps", steps))
            steps, last = 0, time.monotonic()

    def on_result(result: GroupResult) -> None:
        nonlocal steps
        if steps:
            send(("steps", steps))
            steps = 0
        send(("result", result))

    def more() -> list[GroupTask]:
        tasks: list[GroupTask] = []
        with contextlib.suppress(queue.Empty):
            while True:
                tasks.extend(inbox.get_nowait())
        return tasks

    while True:
        first = inbox.get()
        try:
            decode_tasks(model, recipe, first, on_result, on_step, more=more, policy=policy)
        except Exception as exc:  # reported, then this worker ends: its groups are requeued
            send(("error", _one_line(exc)))
            return


_STOP_SENDING = object()


class _Sender:
    """The driver's sends to one worker, from a thread of their own.

    A worker that stops reading its pipe (stopped, or hung while holding the GIL so that its
    reader thread never runs) would block a send larger than the pipe's buffer, and a driver
    blocked there would never see the worker stall. So messages are pickled here (a message
    that cannot be pickled raises in the driver) and written by the thread; a write that
    blocks holds only the thread, until the worker is killed (the write then fails and the
    thread ends)."""

    def __init__(self, conn: Connection, name: str) -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.failed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            payload = self._queue.get()
            if payload is _STOP_SENDING:
                return
            try:
                self._conn.send_bytes(payload)
            except Exception:  # the worker is gone (or its pipe closed): nothing more to send
                self.failed = True
                return

    def send(self, message: Any) -> None:
        from multiprocessing.reduction import ForkingPickler

        self._queue.put(bytes(ForkingPickler.dumps(message)))

    def stop(self, timeout: float) -> None:
        """Let the thread end (after what is queued; at once if its worker is dead)."""
        self._queue.put(_STOP_SENDING)
        self._thread.join(timeout)


@dataclass
class _Worker:
    number: int
    process: Any
    conn: Connection
    sender: _Sender
    ready: bool = False
    pid: int | None = None
    #: When it last showed progress (a message, or a lease while it held nothing).
    last_progress: float = 0.0
    started_at: float = 0.0


@dataclass
class LocalExecutor(PooledExecutor):
    """``workers`` spawned processes on this machine, each loading the model once and decoding
    up to ``concurrent_groups`` groups at a time (see :func:`_worker_main`).

    :meth:`start` spawns them and waits until each has loaded the model and passed its checks
    (the identity against the driver's and the other workers', a transformers model's
    row-invariance check); the driver calls it before it charges the ledger
    (:func:`executor_session`). :meth:`run` starts them itself if :meth:`start` was not called.

    Each worker holds at most two chunks of ``chunk_size`` groups (default: the run's
    concurrent groups), so its engine is refilled as groups retire. A worker that dies (a
    crash, a kill, out of memory) is replaced and its unreturned groups are requeued; a group
    retried ``max_retries`` times stops the run. A worker that holds groups and reports no
    progress (decode steps, at most every 0.2 s, or finished groups) for ``stall_timeout_s``
    is hung: it is terminated (then killed), and handled like one that died. A worker whose
    model is not the driver's (another library version, dtype or device) or refuses
    its configuration stops the run at once."""

    workers: int = 2
    chunk_size: int | None = None
    max_retries: int = DEFAULT_MAX_RETRIES
    events: EventHook | None = None
    name: str = "local"
    #: How many replacement workers may be started in all (default: 2 × workers + retries).
    max_restarts: int | None = None
    #: Seconds a worker may take to load its model and report ready.
    start_timeout_s: float = 600.0
    #: Seconds a worker holding groups may report no progress before it is declared hung.
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S

    def start(self, recipe: WorkerRecipe, groups: int | None = None) -> None:
        """Spawn ``min(workers, groups)`` workers and wait until every one is ready. Raises
        :class:`ExecutorError` when one cannot start (its model fails to load or to pass its
        checks, or differs from the driver's or another worker's)."""
        if self._pool is not None and self._pool.recipe is not recipe:
            self.close()
        if self._pool is None:
            count = min(self.workers, max(1, groups if groups is not None else self.workers))
            self._pool = _LocalPool(self, recipe)
            try:
                for _ in range(count):
                    self._pool.spawn()
            except BaseException:
                self.close()
                raise
        try:
            self._pool.wait_ready()
        except BaseException:
            self.close()
            raise



class _LocalPool:
    """The worker processes of one :class:`LocalExecutor` run and the driver's side of their
    protocol (messages ``ready``, ``steps``, ``result``, ``fatal``, ``error``)."""

    def __init__(self, owner: LocalExecutor, recipe: WorkerRecipe) -> None:
        self.owner = owner
        self.recipe = recipe
        self.ctx = multiprocessing.get_context("spawn")
        self.live: dict[int, _Worker] = {}
        self.counter = 0
        self.restarts_left = (owner.max_restarts if owner.max_restarts is not None
                              else 2 * owner.workers + owner.max_retries)
        self.pin = IdentityPin()
        self.table: LeaseTable | None = None
        self.on_step: Callable[[int], None] | None = None

    def spawn(self) -> None:
        mine, theirs = self.ctx.Pipe(duplex=True)
        number = self.counter
        process = self.ctx.Process(target=_worker_main, args=(theirs, self.recipe, number),
                                   daemon=True, name=f"dplang-worker-{number}")
        process.start()
        theirs.close()
        now = time.monotonic()
        self.live[number] = _Worker(number, process, mine,
                                    _Sender(mine, f"dplang-send-{number}"),
                                    last_progress=now, started_at=now)
        self.owner._emit("worker_started", worker=number, pid=process.pid)
        self.counter += 1

    def handle(self, worker: _Worker, message: Any) -> None:
        kind = message[0]
        worker.last_progress = time.monotonic()
        if kind == "ready":
            self.pin.check(worker.number, message[2])
            worker.ready, worker.pid = True, int(message[1])
            self.owner._emit("worker_ready", worker=worker.number, pid=worker.pid)
        elif kind == "result":
            if self.table is None:  # pragma: no cover - a protocol bug
                raise ExecutorError(f"worker {worker.number} returned a group it was not given")
            result = message[1]
            accepted = self.table.returned(worker.number, result)
            self.owner._emit("result" if accepted else "duplicate_dropped",
                             worker=worker.number, group=result.index)
        elif kind == "steps":
            if self.on_step is not None:
                self.on_step(int(message[1]))
        elif kind == "fatal":
            raise ExecutorError(f"worker {worker.number} cannot start: {message[1]}")
        elif kind == "error":
            raise _WorkerFailed(str(message[1]))
        else:  # pragma: no cover - a protocol bug
            raise ExecutorError(f"worker {worker.number} sent an unknown message {kind!r}")

    def retire(self, worker: _Worker, reason: str) -> None:
        """Drain what the worker sent before it went, stop it, requeue its groups, and start
        a replacement (while restarts are left and groups remain)."""
        with contextlib.suppress(Exception):
            while worker.conn.poll(0):
                message = worker.conn.recv()
                if message[0] == "result":
                    self.handle(worker, message)
        if worker.process.is_alive():  # hung (or ending): ask first, then force
            worker.process.terminate()
            worker.process.join(2)
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(5)
        # its pipe closes only now: a send blocked on a worker that stopped reading fails
        # once the worker is gone, and the sender thread never writes to a reused descriptor
        worker.sender.stop(2)
        worker.conn.close()
        del self.live[worker.number]
        table = self.table
        requeued = table.lost(worker.number, reason) if table is not None else []
        self.owner._emit("worker_lost", worker=worker.number, pid=worker.pid, reason=reason,
                         requeued=requeued)
        if table is not None and table.done:
            return
        if self.restarts_left <= 0:
            if not self.live:
                raise ExecutorError(f"every worker failed (last: {reason}); the run "
                                    "stops; rerun the same command to resume")
            return  # carry on with the workers left
        self.restarts_left -= 1
        self.spawn()

    def poll(self) -> None:
        """Wait (at most a second) for messages and ends, handle them, and retire workers that
        died, did not start in time or stopped making progress."""
        owner, table = self.owner, self.table
        objects: list[Any] = []
        for worker in self.live.values():
            objects += [worker.conn, worker.process.sentinel]
        ready = wait(objects, timeout=min(1.0, owner.stall_timeout_s / 4))
        for worker in list(self.live.values()):
            if worker.number not in self.live:
                continue
            reason = None
            if worker.conn in ready:
                try:
                    while worker.conn.poll(0):
                        self.handle(worker, worker.conn.recv())
                except _WorkerFailed as failed:
                    reason = f"worker raised {failed}"
                except (EOFError, OSError, pickle.UnpicklingError, AttributeError,
                        TypeError, IndexError):
                    reason = "its pipe broke"
            if reason == "its pipe broke" or (reason is None and
                                              worker.process.sentinel in ready):
                worker.process.join(2)  # it ended (or is ending): reap it first
                code = worker.process.exitcode
                if code is not None:
                    reason = (f"worker exited with code {code}" if code >= 0
                              else f"worker killed by signal {-code}")
            now = time.monotonic()
            if (reason is None and not worker.ready
                    and now - worker.started_at > owner.start_timeout_s):
                reason = f"worker did not start within {owner.start_timeout_s:g} s"
            if (reason is None and worker.ready and table is not None
                    and table.outstanding(worker.number)
                    and now - worker.last_progress > owner.stall_timeout_s):
                reason = (f"worker made no progress for {owner.stall_timeout_s:g} s "
                          "(hung); it was stopped")
                owner._emit("worker_stalled", worker=worker.number, pid=worker.pid,
                            seconds=owner.stall_timeout_s)
            if reason is not None:
                self.retire(worker, reason)

    def wait_ready(self) -> None:
        """Return once every live worker is ready (replacing those that die meanwhile)."""
        while not all(worker.ready for worker in self.live.values()):
            self.poll()

    def dispatch(self, table: LeaseTable, on_step: Callable[[int], None] | None) -> None:
        """Lease groups to ready workers (two chunks each at most) until ``table.done``."""
        self.table, self.on_step = table, on_step
        try:
            chunk = table.chunk_size
            while not table.done:
                for worker in list(self.live.values()):
                    if not worker.ready:
                        continue
                    while table.outstanding(worker.number) < 2 * chunk and table.has_work():
                        idle = table.outstanding(worker.number) == 0
                        tasks = table.lease(worker.number)
                        if not tasks:
                            break
                        if idle:  # its progress clock starts with its first groups
                            worker.last_progress = time.monotonic()
                        # never blocks (a worker that stops reading is caught by its stall
                        # timer); one that died is found by its sentinel in poll()
                        worker.sender.send(tasks)
                        self.owner._emit("leased", worker=worker.number,
                                         groups=[t.index for t in tasks])
                self.poll()
        finally:
            self.table, self.on_step = None, None

    def close(self) -> None:
        for worker in list(self.live.values()):
            with contextlib.suppress(Exception):
                worker.sender.send(None)  # end (after what was sent)
        deadline = time.monotonic() + 5
        for worker in list(self.live.values()):
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(5)
            worker.sender.stop(2)
            with contextlib.suppress(Exception):
                worker.conn.close()
        self.live.clear()


class _WorkerFailed(Exception):
    """A worker reported an exception while decoding (then it ended)."""
