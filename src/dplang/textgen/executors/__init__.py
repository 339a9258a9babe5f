"""Executors: where a run's generation groups are decoded. The driver is the only writer.

* ``inline``: the driver decodes every group itself (:class:`InlineExecutor`, the reference).
* ``local``: spawned worker processes on this machine (:mod:`.local`).
* ``ray``: Ray actors (:mod:`.ray`, optional extra ``dplang[distributed]``).

The contract every executor keeps (the driver charges, keeps the seed and writes; each group is
committed exactly once, in group order; the output is the same bytes for every executor) is
stated in :mod:`.base`, with the protocol and what the executors share. This module is the
factory (:func:`check_executor`, :func:`make_executor`: a backend is imported only when it is
asked for, so a run that decodes inline never imports the worker machinery, after vLLM's
``Executor.get_class``) and the glue between a planned run and its executor
(:func:`plan_recipe`, :func:`dispatch_plan`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ...models.base import PromptModel
from ..engine import GroupJob, GroupResult, StepPolicy
from .base import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_STALL_TIMEOUT_S,
    EventHook,
    Executor,
    ExecutorError,
    GroupTask,
    InlineExecutor,
    LeaseTable,
    ModelSource,
    OrderedCommit,
    WorkerRecipe,
    check_stall_timeout,
    decode_tasks,
    dispatch_groups,
    executor_session,
    model_identity,
)

if TYPE_CHECKING:
    from .local import LocalExecutor
    from .ray import RayExecutor

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
    "RayExecutor",
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

#: The backends with workers, imported on first use (``dplang.textgen.executors.LocalExecutor``).
_BACKENDS = {"LocalExecutor": "local", "RayExecutor": "ray"}


def __getattr__(name: str) -> Any:  # PEP 562
    if name in _BACKENDS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_BACKENDS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_executor(name: str, workers: int, method: str = "invisibleink",
                   worker_timeout: float | None = None) -> None:
    """Check ``--executor``/``--workers``/``--worker-timeout`` (milliseconds; nothing read or
    charged). Raises ``ValueError`` with a one-line message."""
    if name not in EXECUTORS:
        raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}, got {name}")
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if name == "inline" and workers != 1:
        raise ValueError(f"--workers {workers} applies to --executor local or ray; the inline "
                         "executor decodes in this process (add --executor local)")
    if worker_timeout is not None:
        if name == "inline":
            raise ValueError("--worker-timeout applies to --executor local or ray (the inline "
                             "executor has no worker to time out)")
        check_stall_timeout(worker_timeout, "--worker-timeout")
    from ..methods import get_method

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
        from .local import LocalExecutor

        return LocalExecutor(workers=workers, events=events, stall_timeout_s=stall)
    if name == "ray":
        from .ray import RayExecutor

        return RayExecutor(workers=workers, address=ray_address, events=events,
                           stall_timeout_s=stall)
    raise ValueError(f"unknown executor {name!r}")


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
                        req.concurrent_groups, req.sparse_head, model_identity(model),
                        special_tokens=req.special_tokens)


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
