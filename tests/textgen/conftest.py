"""Fixtures of the executor tests."""

from __future__ import annotations

import pickle
import pickletools

import pytest


def pickled_values(obj) -> list:
    """Every int and str that a pickle of ``obj`` carries (its opcode arguments): what a
    worker process or Ray actor receives of it."""
    return [arg for _op, arg, _pos in pickletools.genops(pickle.dumps(obj))
            if isinstance(arg, int | str)]


class WorkerInbox:
    """Every object the driver sends to workers: the worker recipe (process arguments, Ray
    actor constructor) and every chunk of tasks (pipe messages, Ray calls)."""

    def __init__(self) -> None:
        self.sent: list = []

    def assert_nothing_secret(self, plan, seed, dataset) -> None:
        """No root seed, dataset name, data path or output path in anything sent."""
        assert len(self.sent) >= 2  # the recipe and at least one chunk of tasks
        values = [v for obj in self.sent for v in pickled_values(obj)]
        texts = [v for v in values if isinstance(v, str)]
        assert seed not in values
        for secret in (dataset, str(plan.request.data), plan.request.data.name,
                       str(plan.request.out), plan.request.out.name):
            assert not any(secret in t for t in texts), secret
        assert "GenerationRequest" not in texts  # the request as a whole never travels


@pytest.fixture
def worker_inbox(monkeypatch) -> WorkerInbox:
    """Record what the driver sends to its workers (see :class:`WorkerInbox`)."""
    from dplang.textgen import executors as ex
    from dplang.textgen import orchestration

    inbox = WorkerInbox()
    plan_recipe = orchestration.plan_recipe
    lease = ex.LeaseTable.lease

    def recipe(*args, **kwargs):
        made = plan_recipe(*args, **kwargs)
        inbox.sent.append(made)
        return made

    def leased(self, worker):
        tasks = lease(self, worker)
        inbox.sent.append(tasks)
        return tasks

    monkeypatch.setattr(orchestration, "plan_recipe", recipe)
    monkeypatch.setattr(ex.LeaseTable, "lease", leased)
    return inbox
