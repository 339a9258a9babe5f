"""Executors: where a run's generation groups are decoded. The driver is the only writer.

A run has one *driver* (the process that ran ``dplang generate``) and an *executor* that
decodes its groups:

* ``inline``: the driver decodes every group itself (the engine's continuous batching).
* ``local``: ``N`` spawned worker processes on this machine, each with its own copy of the model
  (one per GPU, or per share of the CPU).
* ``ray``: Ray actors (:mod:`dplang.textgen.executors_ray`, optional extra
  ``dplang[distributed]``).

Whatever the executor, the driver forms the batches and prompts, charges the ledger once before
anything is dispatched, keeps the secret seed and is the only process that writes the output.
A worker receives chunks of :class:`GroupTask` (a group's prompts and the *initial state* of the
group's random stream, never the root seed: see
:meth:`dplang.privacy.randomness.RandomStreams.initial_state`) and returns finished groups.

Exactly once (:class:`LeaseTable`, :class:`OrderedCommit`):

* a lease table maps each dispatched group to the worker holding it; when a worker dies, the
  groups it held and had not returned are queued again (first, one per chunk, so that a group
  that crashes its worker does not take its neighbours' retries with it);
* a worker that is alive but holds groups and reports no progress (no decode step, no finished
  group) for ``stall_timeout_s`` (a deadlock, stuck I/O, a GPU hang) is stopped and treated
  exactly like a dead one: its groups are requeued, each dispatch counts toward the retries,
  whatever it might still send is a late duplicate, and a replacement is started;
* a group returned twice (a late duplicate from a worker declared dead, a redelivery) is dropped
  at commit: two released texts for one group would be two draws from the mechanism;
* a group that keeps failing stops the run after ``max_retries`` retries with an error. It is
  never skipped: whether a group fails may depend on its references, so a skip would be a
  data-dependent release.

Byte-identical output: groups are written in group order, whatever order they finish in, and a
group's text is a function of its own prompts and its own stream only (the engine's row
invariance, DESIGN.md invariants 5 and 7). So the output file is the same bytes for every
executor, worker count, concurrency and interruption: a resumed run's file equals an
uninterrupted one's. The price is a reorder buffer: groups that finish before an earlier one are
held in the driver's memory (at most the reorder window) and recomputed, identically, if the
driver is killed before it writes them.

Size: the lease table, the in-order exactly-once commit and the local executor are one protocol
and are read together; Ray is in executors_ray.py.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import pickle
import queue
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

from ..models.base import LogitsModel, PromptModel
from ..privacy.randomness import RandomStreams, StreamStates
from .engine import GroupJob, GroupResult, StepPolicy, run_groups

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_STALL_TIMEOUT_S",
    "EXECUTORS",
    "Executor",
    "ExecutorError",
    "GroupTask",
    "InlineExecutor",
    "LeaseTable",
    "LocalExecutor",
    "ModelSource",
    "OrderedCommit",
    "WorkerRecipe",
    "check_executor",
    "decode_tasks",
    "dispatch_groups",
    "dispatch_plan",
    "executor_session",
    "make_executor",
    "model_identity",
    "plan_recipe",
]

#: Executor names of ``--executor``.
EXECUTORS = ("inline", "local", "ray")
#: Retries of one group before the run stops (each group is dispatched at most 1 + k times).
DEFAULT_MAX_RETRIES = 2
#: Seconds a worker holding groups may go without reporting progress (a decode step or a
#: finished group) before it is declared hung, stopped and replaced (``--worker-timeout``).
DEFAULT_STALL_TIMEOUT_S = 600.0

#: ``events(name, fields)``: what an executor did, for logs and tests: worker numbers, process
#: ids, group indices, never texts or references; but a ``reason`` quotes a worker's exception
#: message, which may mention what it was decoding: show it to the data holder only.
EventHook = Callable[[str, dict[str, Any]], None]


class ExecutorError(RuntimeError):
    """A run stopped by its executor (one-line message). What was committed stays in the
    output; rerunning the same command resumes after it."""


# --------------------------------------------------------------------------- units of work


@dataclass(frozen=True)
class GroupTask:
    """One group as a worker receives it: its job (prompts, public prefix) and the initial
    state of its random stream.

    Privacy contract: the state opens this group's stream only, and the prompts carry its
    references: a task is as private as the references (it travels between the driver's
    processes, or over Ray's object store inside the cluster; it is never written to disk)."""

    job: GroupJob
    stream_state: dict[str, Any]

    @property
    def index(self) -> int:
        return self.job.index


@dataclass(frozen=True)
class ModelSource:
    """How a worker obtains the run's model: a picklable ``instance`` (the toy models), or
    a ``spec`` (``--model``) loaded with ``dtype``, ``device`` and ``threads``."""

    instance: LogitsModel | None = None
    spec: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    threads: int | None = None

    @classmethod
    def for_model(cls, model: PromptModel, spec: str, dtype: str) -> ModelSource:
        """The source that reproduces the driver's ``model`` (loaded from ``spec`` in
        ``dtype``; a whole model or only its prompt side) in another process: a transformers
        model is loaded again from its spec on the same device with the same thread count (the
        worker checks that it got the same identity); any other model is sent pickled. Raises
        :class:`ExecutorError` for a model that cannot be sent."""
        text_side = sys.modules.get("dplang.models.prompt_side")
        if text_side is not None and isinstance(model, text_side.TokenizerText):
            return cls(spec=spec, dtype=str(model.dtype).replace("torch.", ""),  # type: ignore[attr-defined]
                       device=getattr(model, "device_type", "cpu"),
                       threads=model.threads)  # type: ignore[attr-defined]
        try:
            pickle.dumps(model)
        except Exception as exc:  # any pickling failure: the model cannot leave this process
            raise ExecutorError(f"the model {model.model_id} cannot be sent to worker "
                                f"processes ({type(exc).__name__}); use --executor inline"
                                ) from None
        return cls(instance=model)

    def load(self) -> LogitsModel:
        """The model, in this process."""
        if self.instance is not None:
            return self.instance
        if self.spec is None:
            raise ValueError("a ModelSource needs an instance or a spec")
        from ..models.default import resolve_model

        kwargs: dict[str, Any] = {"threads": self.threads, "dtype": self.dtype}
        if self.device != "cpu":
            kwargs["device"] = self.device
        return resolve_model(self.spec, **kwargs)


def model_identity(model: PromptModel) -> dict[str, Any]:
    """What must be equal between the driver's model and a worker's for the worker to compute
    the same bits: id, weights digest, numerics (library versions, thread count, dtype,
    device) and, for a whole model, vocabulary and EOS ids (a driver that loaded only the
    prompt side, :class:`~dplang.models.prompt_side.PromptSide`, does not know those: the
    executors then require every worker to agree with the first one). Public."""
    identity = {
        "model_id": model.model_id,
        "weights_sha256": model.weights_digest(),
        "numerics": getattr(model, "numerics", None),
    }
    if hasattr(model, "vocab_size") and hasattr(model, "eos_token_ids"):
        identity["vocab_size"] = int(model.vocab_size)
        identity["eos_token_ids"] = sorted(int(t) for t in model.eos_token_ids)
    return identity


@dataclass(frozen=True)
class WorkerRecipe:
    """Everything a worker needs to decode groups exactly as the driver would (picklable,
    public: no seed, no reference).

    ``policy_factory(vocab_size)`` returns the per-group step-policy factory (a module-level
    function with its public parameters bound, e.g. ``functools.partial``); ``identity`` is
    the driver's :func:`model_identity`, which the worker's model must match (on the keys it
    has)."""

    model: ModelSource
    policy_factory: Callable[[int], Callable[[GroupJob], StepPolicy]]
    batch_size: int
    max_tokens: int
    concurrent_groups: int
    sparse_head: bool
    identity: dict[str, Any]


def _identity_diffs(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """``key: want → got`` for every key of ``want`` that ``got`` does not equal."""
    diffs = []
    for key in sorted(want):
        a, b = want.get(key), got.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += [f"{key}.{k}: {a.get(k)!r} → {b.get(k)!r}"
                      for k in sorted(set(a) | set(b), key=str) if a.get(k) != b.get(k)]
        else:
            diffs.append(f"{key}: {a!r} → {b!r}")
    return diffs


def check_identity(model: LogitsModel, recipe: WorkerRecipe) -> dict[str, Any]:
    """A worker's model's :func:`model_identity` (it reports it to the driver), once checked
    against the driver's on every key the driver knows. Raises :class:`ExecutorError` naming
    what differs (another library version, thread count, device...): its texts would
    differ."""
    mine = model_identity(model)
    diffs = _identity_diffs(recipe.identity, mine)
    if diffs:
        raise ExecutorError("a worker's model differs from the driver's, so its texts would "
                            f"differ ({'; '.join(diffs[:3])})")
    return mine


class _IdentityPin:
    """The driver's check that every worker of a run has the same model: the first worker's
    whole identity (with the vocabulary and EOS ids that a prompt-side driver does not know)
    is pinned, and every later worker must report the same."""

    def __init__(self) -> None:
        self.first: tuple[int, dict[str, Any]] | None = None

    def check(self, worker: int, identity: dict[str, Any], label: str = "worker") -> None:
        if self.first is None:
            self.first = (worker, identity)
            return
        number, pinned = self.first
        diffs = _identity_diffs(pinned, identity)
        if diffs:
            raise ExecutorError(f"{label} {worker}'s model differs from {label} {number}'s, "
                                f"so its texts would differ ({'; '.join(diffs[:3])})")


class _TaskFeed:
    """The engine's job iterator over tasks: registers each task's stream state as the engine
    admits its group. ``more()`` is asked for further tasks when the local ones run out (a
    worker polls its inbox without waiting); an empty answer ends admission for now."""

    def __init__(self, tasks: Iterable[GroupTask],
                 more: Callable[[], Sequence[GroupTask]] | None = None) -> None:
        self._tasks: Iterator[GroupTask] = iter(tasks)
        self._buffer: deque[GroupTask] = deque()
        self._more = more
        self.states = StreamStates({})

    def __iter__(self) -> _TaskFeed:
        return self

    def __next__(self) -> GroupJob:
        task = next(self._tasks, None)
        if task is None:
            if not self._buffer and self._more is not None:
                self._buffer.extend(self._more())
            if not self._buffer:
                raise StopIteration
            task = self._buffer.popleft()
        self.states.add(task.index, task.stream_state)
        return task.job


def decode_tasks(
    model: LogitsModel,
    recipe: WorkerRecipe,
    tasks: Iterable[GroupTask],
    on_result: Callable[[GroupResult], None],
    on_step: Callable[[int], None] | None = None,
    more: Callable[[], Sequence[GroupTask]] | None = None,
    policy: Callable[[GroupJob], StepPolicy] | None = None,
) -> None:
    """Decode ``tasks`` (then whatever ``more()`` returns) on ``model`` with the engine, each
    group from its own stream state: the texts equal the driver's inline ones, bit for bit.
    ``policy`` overrides ``recipe.policy_factory(model.vocab_size)``."""
    feed = _TaskFeed(tasks, more)
    make_policy = policy or recipe.policy_factory(model.vocab_size)
    run_groups(model, feed, make_policy, recipe.batch_size, recipe.max_tokens, feed.states,
               recipe.concurrent_groups, on_result=on_result, on_step=on_step,
               sparse_head=recipe.sparse_head)


# ------------------------------------------------------------------ exactly once, in order


class OrderedCommit:
    """The driver's one gate to the output: each group is committed once, in group order.

    ``offer(result)`` accepts the first result of a dispatched group and drops any later one
    (counted in ``duplicates_dropped``); results are handed to ``persist`` in ascending group
    order, so groups that finish early wait in a reorder buffer until the groups before them
    are in. ``received(i)`` tells the lease table that group ``i`` needs no retry."""

    def __init__(self, indices: Iterable[int], persist: Callable[[GroupResult], None]) -> None:
        self._order = sorted(set(indices))
        self._position = {index: n for n, index in enumerate(self._order)}
        self._persist = persist
        self._held: dict[int, GroupResult] = {}
        self._received: set[int] = set()
        self._next = 0
        self.duplicates_dropped = 0

    def __len__(self) -> int:
        return len(self._order)

    @property
    def committed(self) -> int:
        """Groups handed to ``persist`` so far."""
        return self._next

    @property
    def complete(self) -> bool:
        return self._next == len(self._order)

    @property
    def held(self) -> int:
        """Results received but waiting for an earlier group."""
        return len(self._held)

    def position(self, index: int) -> int:
        """Rank of group ``index`` among this run's groups."""
        return self._position[index]

    def received(self, index: int) -> bool:
        return index in self._received

    def offer(self, result: GroupResult) -> bool:
        """Accept ``result`` unless its group is already in (then it is dropped: ``False``).
        Raises :class:`ExecutorError` for a group this run did not dispatch."""
        if not isinstance(result, GroupResult) or result.index not in self._position:
            raise ExecutorError(f"an executor returned group {getattr(result, 'index', '?')}, "
                                "which this run did not dispatch")
        if result.index in self._received:
            self.duplicates_dropped += 1
            return False
        self._received.add(result.index)
        self._held[result.index] = result
        while self._next < len(self._order) and self._order[self._next] in self._held:
            self._persist(self._held.pop(self._order[self._next]))
            self._next += 1
        return True


class LeaseTable:
    """Which worker holds which group, and what to dispatch next.

    Groups are leased in group order, failed groups first and one per chunk; never further
    than ``window`` groups past the oldest uncommitted one (this bounds the reorder buffer).
    A worker that is lost (:meth:`lost`) gives back its groups that were not received; a group
    dispatched more than ``1 + max_retries`` times stops the run (:class:`ExecutorError`)."""

    def __init__(self, jobs: Sequence[GroupJob], commit: OrderedCommit, streams: RandomStreams,
                 *, chunk_size: int, max_retries: int = DEFAULT_MAX_RETRIES,
                 window: int | None = None) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk size must be >= 1, got {chunk_size}")
        if max_retries < 0:
            raise ValueError(f"max retries must be >= 0, got {max_retries}")
        self._jobs = {job.index: job for job in jobs}
        self._queue: deque[int] = deque(sorted(self._jobs))
        self._retry: deque[int] = deque()
        self._commit = commit
        self._streams = streams
        self.chunk_size = chunk_size
        self.max_retries = max_retries
        self.window = window if window is not None else max(256, 8 * chunk_size)
        self.leases: dict[int, Hashable] = {}
        self.attempts: Counter[int] = Counter()
        self.last_error: dict[int, str] = {}

    @property
    def done(self) -> bool:
        return self._commit.complete

    def __len__(self) -> int:
        """Groups this table dispatches in all."""
        return len(self._jobs)

    def outstanding(self, worker: Hashable) -> int:
        """Groups leased to ``worker`` and not yet returned."""
        return sum(1 for w in self.leases.values() if w == worker)

    def has_work(self) -> bool:
        """Whether :meth:`lease` would hand out something now."""
        return bool(self._retry) or (bool(self._queue) and self._within_window(self._queue[0]))

    def _within_window(self, index: int) -> bool:
        return self._commit.position(index) < self._commit.committed + self.window

    def lease(self, worker: Hashable) -> list[GroupTask]:
        """The next chunk for ``worker`` (empty when there is nothing to hand out now)."""
        if self._retry:
            picked = [self._retry.popleft()]
        else:
            picked = []
            while (self._queue and len(picked) < self.chunk_size
                   and self._within_window(self._queue[0])):
                picked.append(self._queue.popleft())
        tasks = []
        for index in picked:
            self.leases[index] = worker
            self.attempts[index] += 1
            tasks.append(GroupTask(self._jobs[index], self._streams.initial_state(index)))
        return tasks

    def returned(self, worker: Hashable, result: GroupResult) -> bool:
        """``worker`` returned ``result``: its lease ends and the result is offered for
        commit. ``False`` when the result was a duplicate (dropped)."""
        if self.leases.get(result.index) == worker:
            del self.leases[result.index]
        accepted = self._commit.offer(result)
        if accepted:  # a requeued copy still waiting in the queue is no longer needed
            with contextlib.suppress(ValueError):
                self._retry.remove(result.index)
        return accepted

    def lost(self, worker: Hashable, reason: str) -> list[int]:
        """``worker`` is gone (died, raised, was killed): the groups it held and had not
        returned go back to the queue. Returns them; raises :class:`ExecutorError` when one has
        used up its retries (the run stops; nothing is skipped)."""
        held = sorted(i for i, w in self.leases.items() if w == worker)
        requeue = []
        for index in held:
            del self.leases[index]
            if self._commit.received(index):
                continue
            self.last_error[index] = reason
            if self.attempts[index] > self.max_retries:
                raise ExecutorError(
                    f"group {index} failed {self.attempts[index]} times (last: {reason}); the "
                    "run stops rather than skip it (a skipped group would be a data-dependent "
                    "release); fix the cause and rerun the same command to resume")
            requeue.append(index)
        self._retry.extend(requeue)
        return requeue


# ------------------------------------------------------------------------------ executors


class Executor(Protocol):
    """Decodes dispatched groups and hands every finished group to ``table.returned``.

    Contract: an executor may deliver results in any order and more than once (the table and
    the commit make that exactly once, in order); it must call ``table.lost`` for a worker that
    stops holding groups it did not return, and return only when ``table.done``, or raise
    :class:`ExecutorError`. It never writes the output and never sees the root seed.

    An executor with workers may also have ``start(recipe, groups)``, which starts them and
    returns once each has loaded the model and passed its checks (raising
    :class:`ExecutorError` otherwise), and ``close()``, which stops them:
    :func:`executor_session` calls them around a run, so that a model or configuration the
    workers refuse stops the run before the ledger is charged."""

    name: str

    def run(self, model: PromptModel, recipe: WorkerRecipe, table: LeaseTable,
            on_step: Callable[[int], None] | None) -> None:
        """Decode until ``table.done``."""
        ...


@dataclass
class InlineExecutor:
    """Decode every group in the driver (the engine's continuous batching over the already
    loaded model): today's behaviour, and the reference the other executors must equal."""

    name: str = "inline"

    def run(self, model: PromptModel, recipe: WorkerRecipe, table: LeaseTable,
            on_step: Callable[[int], None] | None,
            policy: Callable[[GroupJob], StepPolicy] | None = None) -> None:
        if not isinstance(model, LogitsModel):
            raise ExecutorError(f"the inline executor needs the whole model; {model.model_id} "
                                "was loaded without its weights (for worker executors)")

        def more() -> list[GroupTask]:
            return table.lease("inline")

        decode_tasks(model, recipe, (), lambda r: table.returned("inline", r), on_step,
                     more=more, policy=policy)
        if not table.done:  # pragma: no cover - the feed hands out every group
            raise ExecutorError("the inline executor stopped before every group was decoded")


@contextlib.contextmanager
def executor_session(executor: Executor | None, recipe: WorkerRecipe | None,
                     groups: int) -> Iterator[None]:
    """Start ``executor``'s workers for ``groups`` groups (when it has workers, ``recipe`` is
    given and there is something to decode) and stop them on leaving, whatever happens.

    The driver enters it before charging the ledger: every worker loads the model and runs its
    load-time checks (identity, row invariance) first, and one that refuses stops the run with
    :class:`ExecutorError` while nothing has been charged or written. Workers receive only the
    public recipe here, nothing private."""
    start = getattr(executor, "start", None)
    close = getattr(executor, "close", None)
    try:
        if start is not None and recipe is not None and groups > 0:
            start(recipe, groups)
        yield
    finally:
        if close is not None:
            close()


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


class _PooledExecutor:
    """What the local and the Ray executor share: a pool of workers started by ``start``
    (before the ledger is charged, when the run is driven by
    :func:`executor_session`) or by :meth:`run` itself, and stopped by :meth:`close`."""

    workers: int
    stall_timeout_s: float
    events: EventHook | None
    _pool: Any

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        check_stall_timeout(self.stall_timeout_s)
        self._pool = None

    def _emit(self, name: str, **fields: Any) -> None:
        if self.events is not None:
            self.events(name, fields)

    def start(self, recipe: WorkerRecipe, groups: int | None = None) -> None:
        raise NotImplementedError

    def run(self, model: PromptModel, recipe: WorkerRecipe, table: LeaseTable,
            on_step: Callable[[int], None] | None) -> None:
        own = self._pool is None or self._pool.recipe is not recipe
        try:
            if own:
                self.start(recipe, len(table))
            assert self._pool is not None
            self._pool.dispatch(table, on_step)
        finally:
            if own:
                self.close()

    def close(self) -> None:
        """Stop the pool's workers (its ``close`` says how); a no-op when none runs."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


@dataclass
class LocalExecutor(_PooledExecutor):
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
    model is not the driver's (another library version, device or thread count) or refuses
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
        self.pin = _IdentityPin()
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


# ---------------------------------------------------------------------------- the driver


def check_stall_timeout(seconds: float, flag: str = "stall_timeout_s") -> None:
    """Raise ``ValueError`` unless ``seconds`` is a finite number > 0."""
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{flag} must be a finite number of seconds > 0, got {seconds}")


def check_executor(name: str, workers: int, method: str = "invisibleink",
                   worker_timeout: float | None = None) -> None:
    """Check ``--executor``/``--workers``/``--worker-timeout`` (milliseconds; nothing read or
    charged). Raises ``ValueError`` with a one-line message."""
    if name not in EXECUTORS:
        raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}, got {name}")
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if worker_timeout is not None:
        check_stall_timeout(worker_timeout, "--worker-timeout")
    from .methods import get_method

    try:
        population = get_method(method).run_population is not None
    except ValueError:
        population = False  # an unknown method is the request check's to refuse
    if name != "inline" and population:
        raise ValueError(f"--executor {name} does not run --method {method} (a population "
                         "method runs whole, in one process); use --executor inline")
    if name == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ValueError("--executor ray needs Ray: pip install 'dplang[distributed]'")


def make_executor(name: str, workers: int = 1, *, ray_address: str | None = None,
                  events: EventHook | None = None,
                  stall_timeout_s: float | None = None) -> Executor:
    """The executor named by ``--executor`` (see :func:`check_executor`);
    ``stall_timeout_s`` (``--worker-timeout``, default :data:`DEFAULT_STALL_TIMEOUT_S`) is how
    long a worker holding groups may report no progress (inline: unused)."""
    stall = DEFAULT_STALL_TIMEOUT_S if stall_timeout_s is None else stall_timeout_s
    if name == "inline":
        return InlineExecutor()
    if name == "local":
        return LocalExecutor(workers=workers, events=events, stall_timeout_s=stall)
    if name == "ray":
        from .executors_ray import RayExecutor

        return RayExecutor(workers=workers, address=ray_address, events=events,
                           stall_timeout_s=stall)
    raise ValueError(f"unknown executor {name!r}")


def dispatch_groups(
    executor: Executor | None,
    model: PromptModel,
    jobs: Sequence[GroupJob],
    seed: int,
    recipe: WorkerRecipe,
    persist: Callable[[GroupResult], None],
    on_step: Callable[[int], None] | None = None,
    policy: Callable[[GroupJob], StepPolicy] | None = None,
) -> OrderedCommit:
    """Decode ``jobs`` with ``executor`` (default inline) and ``persist`` each finished group
    exactly once, in group order. Called by the driver after the ledger charge.

    Privacy contract: ``seed`` stays in this process (workers get per-group stream states);
    ``persist`` (the only writer) sees each group once; a group that cannot be decoded stops
    the run with :class:`ExecutorError` rather than being skipped. ``policy`` is the driver's
    own policy factory (used by the inline executor)."""
    commit = OrderedCommit((job.index for job in jobs), persist)
    if not jobs:
        return commit
    executor = executor if executor is not None else InlineExecutor()
    chunk = getattr(executor, "chunk_size", None) or recipe.concurrent_groups
    table = LeaseTable(jobs, commit, RandomStreams(seed), chunk_size=chunk,
                       max_retries=getattr(executor, "max_retries", DEFAULT_MAX_RETRIES),
                       window=max(256, 4 * getattr(executor, "workers", 1) * chunk))
    if isinstance(executor, InlineExecutor):
        executor.run(model, recipe, table, on_step, policy=policy)
    else:
        executor.run(model, recipe, table, on_step)
    if not commit.complete:
        raise ExecutorError(f"the {executor.name} executor returned before every group was "
                            "committed; rerun the same command to resume")
    return commit


class _PlanLike(Protocol):
    """What :func:`plan_recipe` and :func:`dispatch_plan` read of a
    :class:`~dplang.textgen.orchestration.GenerationPlan`."""

    request: Any
    model: PromptModel
    make_policy: Callable[[GroupJob], StepPolicy] | None


def plan_recipe(
    executor: Executor | None,
    plan: _PlanLike,
    policy_factory: Callable[[int], Callable[[GroupJob], StepPolicy]],
) -> WorkerRecipe:
    """The worker recipe of a planned run: public fields of the plan's request (model spec,
    dtype, B, T, G, sparse head; never its seed, dataset name or paths) with
    ``policy_factory`` (picklable: the policies rebuilt from the method's calibrated public
    parameters) and the driver's model identity (public: no seed, no reference)."""
    req, model = plan.request, plan.model
    inline = executor is None or isinstance(executor, InlineExecutor)
    source = (ModelSource(spec=req.model, dtype=req.dtype) if inline
              else ModelSource.for_model(model, req.model, req.dtype))
    return WorkerRecipe(source, policy_factory, req.batch_size, req.max_tokens,
                        req.concurrent_groups, req.sparse_head, model_identity(model))


def dispatch_plan(
    executor: Executor | None,
    plan: _PlanLike,
    jobs: Sequence[GroupJob],
    seed: int,
    recipe: WorkerRecipe,
    persist: Callable[[GroupResult], None],
    on_step: Callable[[int], None] | None = None,
) -> OrderedCommit:
    """:func:`dispatch_groups` for a planned run with its :func:`plan_recipe` (the one its
    :func:`executor_session` started the workers with)."""
    return dispatch_groups(executor, plan.model, jobs, seed, recipe, persist, on_step,
                           policy=plan.make_policy)
