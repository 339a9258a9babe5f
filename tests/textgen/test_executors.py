"""Executors: exactly once, in group order, byte-identical to the inline run.

A fake executor injects crashes, duplicate and late deliveries and reordering; the ``local``
executor runs two spawned workers on the toy model, one of them SIGKILLed mid-run."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
from dataclasses import dataclass, field

import numpy as np
import pytest

from dplang.models import ToyModel
from dplang.privacy.ledger import PrivacyLedger
from dplang.privacy.randomness import RandomStreams, StreamStates
from dplang.textgen.engine import GroupJob, GroupResult
from dplang.textgen.executors import (
    ExecutorError,
    InlineExecutor,
    LeaseTable,
    LocalExecutor,
    OrderedCommit,
    decode_tasks,
)
from dplang.textgen.orchestration import GenerationRequest, execute_plan, plan_generation

# ----------------------------------------------------------------------------- helpers


def write_data(tmp_path, n=40):
    data = tmp_path / "refs.csv"
    if not data.exists():
        data.write_text("text\n" + "".join(f"review {i}: the soup was {'hot' * (i % 3)}\n"
                                           for i in range(n)))
    template = tmp_path / "t.toml"
    template.write_text('private = "Here: {reference}\\nAnother:"\npublic = "Another:"\n')
    return data, template


def plan_for(tmp_path, lm, name, *, ledger=None, **changes):
    data, template = write_data(tmp_path)
    fields = dict(
        data=data, out=tmp_path / name, batch_size=3, max_tokens=6, temperature=1.0,
        top_k=4, epsilon=10.0, seed=7, prompt=str(template), concurrent_groups=2,
        ledger=ledger if ledger is not None else tmp_path / f"{name}.ledger.sqlite")
    req = GenerationRequest(**{**fields, **changes})
    return plan_generation(req, lambda _spec: lm)


def run(tmp_path, lm, name, executor=None, **changes):
    plan = plan_for(tmp_path, lm, name, **changes)
    summary = execute_plan(plan, executor=executor)
    return plan, summary, (tmp_path / name).read_bytes()


def groups(blob: bytes) -> list[int]:
    return [json.loads(line)["group"] for line in blob.decode().splitlines()]


def releases(plan) -> int:
    return PrivacyLedger(plan.request.ledger).spent(plan.dataset).releases


MODEL = ToyModel(vocab_size=30, eos_after=None)
EOS_MODEL = ToyModel(vocab_size=30, eos_after=3)  # groups end at different steps


# ------------------------------------------------------------------------ stream states


def test_stream_states_draw_exactly_what_the_seeded_streams_draw():
    streams = RandomStreams(12345)
    states = StreamStates({i: streams.initial_state(i) for i in (0, 3, 9)})
    for i in (0, 3, 9):
        want = streams.generator(i).random(50)
        assert np.array_equal(states.generator(i).random(50), want)
        assert np.array_equal(states.generator(i).random(50), want)  # fresh each time
    with pytest.raises(KeyError):
        states.generator(1)  # a stream that was not sent is never a fresh draw
    assert "12345" not in json.dumps(streams.initial_state(3), default=str)


# --------------------------------------------------------------------- commit and leases


def result(i: int, text: str = "t") -> GroupResult:
    return GroupResult(i, [1], text, "length")


def test_ordered_commit_writes_each_group_once_in_group_order():
    written: list[int] = []
    commit = OrderedCommit([5, 1, 3, 7], lambda r: written.append(r.index))
    assert commit.offer(result(3)) and written == []
    assert not commit.offer(result(3, "other"))  # a duplicate is dropped, whatever it says
    assert commit.offer(result(1)) and written == [1, 3]
    assert commit.offer(result(7)) and commit.held == 1
    assert commit.offer(result(5)) and written == [1, 3, 5, 7] and commit.complete
    assert commit.duplicates_dropped == 1
    with pytest.raises(ExecutorError, match="did not dispatch"):
        commit.offer(result(2))


def jobs(n):
    return [GroupJob(i, "P:", (f"r{i}:", "P:")) for i in range(n)]


def test_lease_table_requeues_a_lost_workers_groups_and_stops_after_k_retries():
    written: list[int] = []
    commit = OrderedCommit(range(4), lambda r: written.append(r.index))
    table = LeaseTable(jobs(4), commit, RandomStreams(1), chunk_size=2, max_retries=1)
    a = table.lease("a")
    assert [t.index for t in a] == [0, 1] and table.outstanding("a") == 2
    assert a[0].stream_state == RandomStreams(1).initial_state(0)
    table.returned("a", result(1))
    assert table.lost("a", "crash") == [0]  # 1 came back before the crash
    assert [t.index for t in table.lease("b")] == [0]  # a retry goes first, alone
    table.returned("a", result(0))  # a late result of the lost worker is still group 0's
    assert not table.returned("b", result(0))  # ... and b's copy is a duplicate
    assert written == [0, 1]
    assert [t.index for t in table.lease("b")] == [2, 3]
    table.lost("b", "crash")
    assert [t.index for t in table.lease("c")] == [2]
    with pytest.raises(ExecutorError, match=r"group 2 failed 2 times .*rather than skip"):
        table.lost("c", "crash again")
    assert written == [0, 1]  # nothing after the failing group was skipped over


def test_lease_table_window_bounds_the_reorder_buffer():
    commit = OrderedCommit(range(10), lambda r: None)
    table = LeaseTable(jobs(10), commit, RandomStreams(1), chunk_size=3, window=4)
    assert [t.index for t in table.lease("a")] == [0, 1, 2]
    assert [t.index for t in table.lease("b")] == [3]
    assert table.lease("b") == [] and not table.has_work()
    for i in (1, 2, 3):
        table.returned("x", result(i))
    assert not table.has_work()  # group 0 is still out: nothing further is handed out
    table.returned("a", result(0))
    assert [t.index for t in table.lease("b")] == [4, 5, 6]


# ------------------------------------------------------------------- the fake executor


@dataclass
class ChaosExecutor:
    """An executor whose simulated workers crash mid-chunk (some results delivered, the rest
    lost or delivered late), deliver duplicates, and deliver in shuffled order."""

    seed: int = 0
    crash_rate: float = 0.4
    duplicate_rate: float = 0.4
    chunk_size: int = 2
    max_retries: int = 8
    workers: int = 3
    name: str = "chaos"
    crashes: int = 0
    late_deliveries: int = 0
    log: list = field(default_factory=list)

    def run(self, model, recipe, table, on_step):
        rng = random.Random(self.seed)
        policy = recipe.policy_factory(model.vocab_size)
        late: list[tuple[int, GroupResult]] = []
        worker = 0
        while not table.done:
            worker += 1
            tasks = table.lease(worker)
            if not tasks:  # only late copies are outstanding
                assert late, "nothing leased, nothing in flight, not done"
            out: list[GroupResult] = []
            # a worker's engine sees its tasks in shuffled order
            decode_tasks(model, recipe, rng.sample(tasks, len(tasks)), out.append,
                         policy=policy)
            rng.shuffle(out)
            if tasks and rng.random() < self.crash_rate:
                self.crashes += 1
                cut = rng.randrange(len(out))
                for res in out[:cut]:
                    table.returned(worker, res)
                late += [(worker, r) for r in out[cut:] if rng.random() < 0.5]
                table.lost(worker, "injected crash")
            else:
                for res in out:
                    table.returned(worker, res)
                    if rng.random() < self.duplicate_rate:
                        late.append((worker, res))
            rng.shuffle(late)
            while late and rng.random() < 0.6:
                self.late_deliveries += 1
                table.returned(*late.pop())
        for item in late:
            table.returned(*item)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fake_executor_with_crashes_duplicates_and_reordering_equals_inline(tmp_path, seed):
    _, _, inline = run(tmp_path, EOS_MODEL, "inline.jsonl")
    chaos = ChaosExecutor(seed=seed)
    plan, summary, got = run(tmp_path, EOS_MODEL, "chaos.jsonl", executor=chaos)
    assert got == inline  # byte for byte
    assert groups(got) == sorted(groups(got)) == list(range(len(plan.jobs)))
    assert summary.written == len(plan.jobs)
    assert chaos.crashes > 0 and chaos.late_deliveries > 0
    assert releases(plan) == 1


def test_inline_output_does_not_depend_on_concurrency(tmp_path):
    outs = {run(tmp_path, EOS_MODEL, f"g{g}.jsonl", concurrent_groups=g)[2] for g in (1, 3, 8)}
    assert len(outs) == 1


def test_a_group_that_keeps_failing_stops_the_run_and_a_rerun_resumes(tmp_path):
    _, _, inline = run(tmp_path, MODEL, "inline.jsonl")
    doomed = ChaosExecutor(crash_rate=1.0, max_retries=2)
    plan = plan_for(tmp_path, MODEL, "x.jsonl")
    with pytest.raises(ExecutorError, match="rather than skip"):
        execute_plan(plan, executor=doomed)
    out = tmp_path / "x.jsonl"
    done = groups(out.read_bytes()) if out.exists() else []
    assert done == list(range(len(done)))  # a prefix: no group was skipped over
    manifest = json.loads((tmp_path / "x.manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    plan = plan_for(tmp_path, MODEL, "x.jsonl")
    execute_plan(plan, executor=InlineExecutor())
    assert out.read_bytes() == inline
    assert releases(plan) == 1  # the rerun is the same release: no second charge


# ----------------------------------------------------------------- local worker processes


def test_local_two_workers_equal_inline(tmp_path):
    _, _, inline = run(tmp_path, EOS_MODEL, "inline.jsonl")
    events: list[tuple[str, dict]] = []
    executor = LocalExecutor(workers=2, events=lambda n, f: events.append((n, f)))
    plan, _, got = run(tmp_path, EOS_MODEL, "local.jsonl", executor=executor)
    assert got == inline
    assert {f["worker"] for n, f in events if n == "worker_started"} == {0, 1}
    assert {f["worker"] for n, f in events if n == "result"} <= {0, 1}
    assert releases(plan) == 1


def test_local_worker_sigkilled_mid_run_output_equals_inline(tmp_path):
    slow = ToyModel(vocab_size=30, eos_after=None, step_delay=0.03)  # same identity as MODEL
    _, _, inline = run(tmp_path, MODEL, "inline.jsonl")
    events: list[tuple[str, dict]] = []
    pids: dict[int, int] = {}

    def hook(name, fields):
        events.append((name, fields))
        if name == "worker_ready":
            pids[fields["worker"]] = fields["pid"]
        if name == "result" and fields["worker"] == 0 and not any(
                n == "killed" for n, _ in events):
            os.kill(pids[0], signal.SIGKILL)  # it still holds leased, unreturned groups
            events.append(("killed", {}))

    executor = LocalExecutor(workers=2, chunk_size=2, events=hook)
    plan, _, got = run(tmp_path, slow, "local.jsonl", executor=executor)
    assert got == inline
    lost = [f for n, f in events if n == "worker_lost"]
    assert lost and lost[0]["worker"] == 0 and "signal 9" in lost[0]["reason"]
    assert lost[0]["requeued"]  # its unreturned groups went to another worker
    assert any(n == "worker_started" and f["worker"] == 2 for n, f in events)  # replaced
    assert releases(plan) == 1


def test_local_refuses_a_worker_whose_model_differs(tmp_path, monkeypatch):
    import dplang.textgen.executors as ex

    real = ex.model_identity
    calls = {"n": 0}

    def identity(model):  # the driver's identity says another thread count
        calls["n"] += 1
        got = real(model)
        return {**got, "numerics": {"threads": 99}} if calls["n"] == 1 else got

    monkeypatch.setattr(ex, "model_identity", identity)
    plan = plan_for(tmp_path, MODEL, "x.jsonl")
    with pytest.raises(ExecutorError,
                       match=r"worker 0 cannot start: a worker's model differs.*threads"):
        execute_plan(plan, executor=LocalExecutor(workers=1))
    assert releases(plan) == 0  # refused before the charge
    assert not (tmp_path / "x.jsonl").exists()


def test_local_worker_reloads_a_transformers_model_and_matches_inline(tmp_path, tiny_llama_dir):
    """A transformers model is not pickled: each worker loads it again from its spec with
    the driver's dtype, device and thread count, checks its identity, and writes the same
    bytes as the inline run."""
    from dplang.models import TransformersModel

    model = TransformersModel(tiny_llama_dir, threads=1)
    _, _, inline = run(tmp_path, model, "inline.jsonl", model=str(tiny_llama_dir), num=4)
    _, _, got = run(tmp_path, model, "local.jsonl", model=str(tiny_llama_dir), num=4,
                       executor=LocalExecutor(workers=1))
    assert got == inline and len(groups(got)) == 4


# ------------------------------------------------------------------------- hung workers


def test_local_hung_worker_is_stopped_and_replaced_output_equals_inline(tmp_path):
    """A worker that stops making progress (here: stuck for ever when group 2 starts, once)
    is stopped after the progress timeout, its groups go to a replacement, and the file is
    the inline run's bytes."""
    _, _, inline = run(tmp_path, MODEL, "inline.jsonl")
    marker = tmp_path / "stalled-once"
    hangs = ToyModel(vocab_size=30, eos_after=None, stall_on="review 7:",  # group 2's
                     stall_marker=marker)  # same identity as MODEL
    events: list[tuple[str, dict]] = []
    executor = LocalExecutor(workers=1, chunk_size=2, stall_timeout_s=1.0,
                             events=lambda n, f: events.append((n, f)))
    plan, _, got = run(tmp_path, hangs, "local.jsonl", executor=executor)
    assert marker.exists()  # it did hang
    assert got == inline
    assert [f["worker"] for n, f in events if n == "worker_stalled"] == [0]
    lost = [f for n, f in events if n == "worker_lost"]
    assert len(lost) == 1 and "no progress for 1 s" in lost[0]["reason"]
    assert 2 in lost[0]["requeued"]
    assert any(n == "worker_started" and f["worker"] == 1 for n, f in events)  # replaced
    assert releases(plan) == 1


def test_a_group_that_hangs_every_time_stops_the_run_never_skipped(tmp_path):
    hangs = ToyModel(vocab_size=30, eos_after=None, stall_on="review 7:")
    plan = plan_for(tmp_path, hangs, "x.jsonl")
    executor = LocalExecutor(workers=1, chunk_size=2, max_retries=1, stall_timeout_s=1.0)
    with pytest.raises(ExecutorError,
                       match=r"group 2 failed 2 times \(last: worker made no progress.*"
                             r"rather than skip"):
        execute_plan(plan, executor=executor)
    # nothing after it; kept in the private folder until the run is complete
    assert groups((tmp_path / ".dplang-private" / "x.jsonl.partial").read_bytes()) == [0, 1]
    assert not (tmp_path / "x.jsonl").exists()
    manifest = json.loads((tmp_path / "x.manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert releases(plan) == 1


def test_a_slow_worker_that_makes_progress_is_not_stopped(tmp_path):
    """A chunk takes longer than the timeout, but every decode step is progress."""
    _, _, inline = run(tmp_path, MODEL, "inline.jsonl", num=4)
    slow = ToyModel(vocab_size=30, eos_after=None, step_delay=0.4)
    events: list[tuple[str, dict]] = []
    executor = LocalExecutor(workers=1, chunk_size=2, stall_timeout_s=1.0,
                             events=lambda n, f: events.append((n, f)))
    _, _, got = run(tmp_path, slow, "local.jsonl", executor=executor, num=4)
    assert got == inline
    assert not [n for n, _ in events if n in ("worker_stalled", "worker_lost")]


def test_a_stopped_worker_that_does_not_read_its_pipe_is_still_stopped_and_replaced(tmp_path):
    """A worker that stops reading its pipe (SIGSTOPped here; or hung holding the GIL, so its
    reader thread never runs) while the driver sends it a chunk larger than the pipe's buffer:
    the send must not block the driver, which would then never see the worker stall."""
    import threading

    data = tmp_path / "refs.csv"
    data.write_text("text\n" + "".join(f"review {i}: {'x' * 30000}\n" for i in range(12)))
    _, _, inline = run(tmp_path, MODEL, "inline.jsonl", max_reference_tokens=30000, num=4)
    events: list[tuple[str, dict]] = []
    pids: list[int] = []

    def hook(name, fields):
        events.append((name, fields))
        if name == "worker_ready" and fields["worker"] == 0:
            pids.append(fields["pid"])
            os.kill(fields["pid"], signal.SIGSTOP)  # stops before its first chunk arrives

    executor = LocalExecutor(workers=1, chunk_size=2, stall_timeout_s=1.0, events=hook)
    outcome: list[object] = []

    def target():
        try:
            outcome.append(run(tmp_path, MODEL, "local.jsonl", executor=executor,
                               max_reference_tokens=30000, num=4))
        except BaseException as exc:  # reported below
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():  # the driver is blocked in its send: free it, then fail
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        thread.join(30)
        pytest.fail("the driver blocked sending to a stopped worker; it was never stopped")
    assert not isinstance(outcome[0], BaseException), outcome[0]
    assert outcome[0][2] == inline
    assert [f["worker"] for n, f in events if n == "worker_stalled"] == [0]


def test_stall_timeout_must_be_positive_and_finite():
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="stall_timeout_s must be a finite number"):
            LocalExecutor(workers=1, stall_timeout_s=bad)


# ------------------------------------------------------- a driver without the model's weights

REFUSING_SOURCE = '''
from dataclasses import dataclass

from dplang.textgen.executors import ModelSource


@dataclass(frozen=True)
class RefusingSource(ModelSource):
    """Loads the model as usual, in a worker whose row-invariance check fails."""

    def load(self):
        import os

        import dplang.models.invariance as inv

        def refuse(model):
            raise inv.RowInvarianceError(
                f"{model.model_id}: a row decoded together with others differs from the same "
                "row decoded alone (simulated)")

        import tempfile

        os.environ[inv.RECHECK_ENV] = "1"
        # This worker's refusal record goes to a cache of its own: other tests load the same
        # tiny model from the same path and must not find it refused.
        os.environ["DPLANG_CACHE_DIR"] = tempfile.mkdtemp(prefix="dplang-refusing-")
        inv.check_row_invariance = refuse
        return super().load()
'''


def private(tmp_path, name):
    return json.loads((tmp_path / ".dplang-private" / name.replace(".jsonl", ".private.json"))
                      .read_text())


def manifest(tmp_path, name):
    found = json.loads((tmp_path / name.replace(".jsonl", ".manifest.json")).read_text())
    found.pop("started")  # when the run began: the only field that differs between runs
    return found


def test_every_worker_must_report_the_first_workers_identity():
    """A prompt-side driver does not know the vocabulary and EOS ids: the first worker's are
    pinned, and a later worker with others stops the run."""
    from dplang.textgen.executors.base import IdentityPin

    first = {"model_id": "m", "vocab_size": 30, "eos_token_ids": [0], "numerics": {"t": 1}}
    pin = IdentityPin()
    pin.check(0, first)
    pin.check(1, dict(first))
    with pytest.raises(ExecutorError, match=r"worker 2's model differs from worker 0's.*"
                                            r"eos_token_ids: \[0\] → \[0, 5\]"):
        pin.check(2, {**first, "eos_token_ids": [0, 5]})


def test_local_driver_with_only_the_prompt_side_equals_inline(tmp_path, tiny_llama_dir):
    """The driver loads the tokenizer and identity only (no weights); the workers load the
    model. Same bytes, same public manifest, same release (one ledger charge) as inline."""
    from dplang.models import PromptSide, TransformersModel, resolve_prompt_side

    spec, ledger = str(tiny_llama_dir), tmp_path / "one.sqlite"
    model = TransformersModel(tiny_llama_dir, threads=1)
    _, _, inline = run(tmp_path, model, "inline.jsonl", model=spec, num=4, ledger=ledger)
    side = resolve_prompt_side(spec, threads=1)
    plan, _, got = run(tmp_path, side, "local.jsonl", model=spec, num=4, ledger=ledger,
                       executor=LocalExecutor(workers=1))
    assert isinstance(plan.model, PromptSide) and plan.make_policy is None
    assert got == inline and len(groups(got)) == 4
    assert manifest(tmp_path, "local.jsonl") == manifest(tmp_path, "inline.jsonl")
    assert (private(tmp_path, "local.jsonl")["release_id"]
            == private(tmp_path, "inline.jsonl")["release_id"])
    assert releases(plan) == 1


def test_a_worker_that_refuses_its_configuration_stops_the_run_before_the_charge(
        tmp_path, tiny_llama_dir, monkeypatch):
    """The row-invariance check runs where the model is loaded, in each worker; a refusal
    stops the run with a one-line error before anything is charged or written."""
    import dplang.textgen.executors as ex
    from dplang.models import resolve_prompt_side

    (tmp_path / "refusing_source.py").write_text(REFUSING_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers inherit sys.path
    from refusing_source import RefusingSource

    real = ex.ModelSource.for_model.__func__

    def for_model(cls, model, spec, dtype):
        return RefusingSource(**vars(real(cls, model, spec, dtype)))

    monkeypatch.setattr(ex.ModelSource, "for_model", classmethod(for_model))
    spec = str(tiny_llama_dir)
    plan = plan_for(tmp_path, resolve_prompt_side(spec, threads=1), "x.jsonl", model=spec,
                    num=4)
    with pytest.raises(ExecutorError, match=r"^worker 0 cannot start: RowInvarianceError: "
                                            r".*differs.*\(simulated\)"):
        execute_plan(plan, executor=LocalExecutor(workers=1))
    assert releases(plan) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("x.")) == [
        "x.jsonl.ledger.sqlite"]


SECOND_REFUSES_SOURCE = '''
import os
import time
from dataclasses import dataclass

from dplang.textgen.executors import ModelSource


@dataclass(frozen=True)
class SecondRefuses(ModelSource):
    """The first worker to load starts; the second refuses (a second later)."""

    marker: str = ""

    def load(self):
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            time.sleep(1.0)
            raise RuntimeError("simulated refusal") from None
        return super().load()
'''


def test_one_of_two_workers_refusing_after_the_other_started_stops_the_run_before_the_charge(
        tmp_path, monkeypatch):
    import multiprocessing

    import dplang.textgen.executors as ex

    (tmp_path / "second_refuses.py").write_text(SECOND_REFUSES_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    from second_refuses import SecondRefuses

    real = ex.ModelSource.for_model.__func__
    marker = str(tmp_path / "first-loaded")

    def for_model(cls, model, spec, dtype):
        return SecondRefuses(**vars(real(cls, model, spec, dtype)), marker=marker)

    monkeypatch.setattr(ex.ModelSource, "for_model", classmethod(for_model))
    plan = plan_for(tmp_path, MODEL, "x.jsonl", num=6)
    with pytest.raises(ExecutorError, match=r"^worker [01] cannot start: RuntimeError: "
                                            r"simulated refusal$"):
        execute_plan(plan, executor=LocalExecutor(workers=2))
    assert releases(plan) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("x.")) == [
        "x.jsonl.ledger.sqlite"]
    assert multiprocessing.active_children() == []  # the worker that had started is stopped


def test_workers_receive_no_ledger_location(tmp_path, monkeypatch):
    """A worker's recipe carries public parameters only: not the ledger's location (a
    PostgreSQL URL may hold a password; an SQLite path names the data holder's files)."""
    import pickle

    from dplang.textgen import orchestration

    recipes = []

    def capture(*args, **kwargs):
        recipe = plan_recipe(*args, **kwargs)
        recipes.append(recipe)
        return recipe

    plan_recipe = orchestration.plan_recipe
    monkeypatch.setattr(orchestration, "plan_recipe", capture)
    ledger = tmp_path / "ledger-location-marker.sqlite"
    plan, _, _ = run(tmp_path, EOS_MODEL, "local.jsonl", ledger=ledger,
                     executor=LocalExecutor(workers=1))
    assert releases(plan) == 1
    assert len(recipes) == 1
    assert b"ledger-location-marker" not in pickle.dumps(recipes[0])



def test_workers_receive_no_seed_dataset_or_paths(tmp_path, worker_inbox):
    """A worker receives what it needs to decode — public calibrated parameters, its groups'
    prompts and stream states — never the root seed, the dataset name, the data path or the
    output path (docs/scaling.md)."""
    seed, dataset = 123456789, "secret-clinic-notes"
    plan, _, out = run(tmp_path, EOS_MODEL, "out-gen.jsonl", seed=seed, dataset=dataset,
                       executor=LocalExecutor(workers=2))
    worker_inbox.assert_nothing_secret(plan, seed, dataset)
    _, _, inline = run(tmp_path, EOS_MODEL, "inline.jsonl", seed=seed, dataset=dataset)
    assert out == inline
