"""``--executor ray``: two actors on a real local Ray instance give the inline
run's bytes, also when one actor is SIGKILLed mid-chunk. Skipped where Ray is not installed
(``pip install 'dplang[distributed]'``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from dplang.models import ToyModel
from dplang.privacy.ledger import PrivacyLedger
from dplang.textgen.executors import ExecutorError
from dplang.textgen.orchestration import GenerationRequest, execute_plan, plan_generation

ray = pytest.importorskip("ray")
from dplang.textgen.executors.ray import RayExecutor  # noqa: E402

pytestmark = pytest.mark.ray

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def ray_instance():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": SRC}})
    yield
    ray.shutdown()


def plan_for(tmp_path, model, name, num=None, spec="default"):
    data = tmp_path / "refs.csv"
    if not data.exists():
        data.write_text("text\n" + "".join(f"review {i}: {'good ' * (i % 4)}\n"
                                           for i in range(36)))
    template = tmp_path / "t.toml"
    template.write_text('private = "Here: {reference}\\nAnother:"\npublic = "Another:"\n')
    req = GenerationRequest(data=data, out=tmp_path / name, batch_size=3, max_tokens=6,
                            temperature=1.0, top_k=4, epsilon=10.0, seed=11,
                            prompt=str(template), concurrent_groups=2, num=num, model=spec,
                            ledger=tmp_path / f"{name}.sqlite")
    return plan_generation(req, lambda _spec: model)


def run(tmp_path, model, name, executor=None, num=None, spec="default"):
    plan = plan_for(tmp_path, model, name, num, spec)
    execute_plan(plan, executor=executor)
    return plan, (tmp_path / name).read_bytes()


def test_two_ray_actors_one_killed_mid_chunk_equal_inline(tmp_path, ray_instance):
    _, inline = run(tmp_path, ToyModel(vocab_size=30, eos_after=3), "inline.jsonl")
    slow = ToyModel(vocab_size=30, eos_after=3, step_delay=0.05)
    events: list[tuple[str, dict]] = []
    pids: dict[int, int] = {}

    def hook(name, fields):
        events.append((name, fields))
        if name == "worker_ready":
            pids[fields["worker"]] = fields["pid"]
        leased_to_0 = [f for n, f in events if n == "leased" and f["worker"] == 0]
        if name == "leased" and fields["worker"] == 0 and len(leased_to_0) == 2:
            os.kill(pids[0], signal.SIGKILL)  # two chunk calls in flight on actor 0

    plan, got = run(tmp_path, slow, "ray.jsonl", RayExecutor(workers=2, chunk_size=2,
                                                             events=hook))
    assert got == inline
    lost = [f for n, f in events if n == "worker_lost"]
    assert lost and lost[0]["worker"] == 0 and lost[0]["requeued"]
    assert any(n == "worker_ready" and f["worker"] == 2 for n, f in events)  # replaced
    assert PrivacyLedger(plan.request.ledger).spent(plan.dataset).releases == 1


def test_a_ray_actor_whose_model_differs_stops_the_run(tmp_path, ray_instance, monkeypatch):
    import dplang.textgen.executors as ex

    real = ex.model_identity
    monkeypatch.setattr(ex, "model_identity",
                        lambda m: {**real(m), "numerics": {"threads": 99}})
    plan = plan_for(tmp_path, ToyModel(vocab_size=30), "x.jsonl")
    with pytest.raises(ExecutorError, match=r"Ray worker 0 cannot start: .*differs"):
        execute_plan(plan, executor=RayExecutor(workers=1))
    assert PrivacyLedger(plan.request.ledger).spent(plan.dataset).releases == 0  # not charged


def test_a_hung_ray_actor_is_killed_and_replaced_output_equals_inline(tmp_path, ray_instance):
    """An actor stuck mid-chunk (group 2 never finishes its first step, once) shows no
    progress through its probe; it is killed after the timeout and replaced, and the file is
    the inline run's bytes."""
    _, inline = run(tmp_path, ToyModel(vocab_size=30, eos_after=3), "inline.jsonl")
    marker = tmp_path / "stalled-once"
    hangs = ToyModel(vocab_size=30, eos_after=3, stall_on="review 7:", stall_marker=marker)
    events: list[tuple[str, dict]] = []
    executor = RayExecutor(workers=1, chunk_size=2, stall_timeout_s=2.0,
                           events=lambda n, f: events.append((n, f)))
    plan, got = run(tmp_path, hangs, "ray.jsonl", executor)
    assert marker.exists()  # it did hang
    assert got == inline
    assert [f["worker"] for n, f in events if n == "worker_stalled"] == [0]
    lost = [f for n, f in events if n == "worker_lost"]
    assert lost and all("no progress for 2 s" in f["reason"] for f in lost)
    assert any(2 in f["requeued"] for f in lost)
    assert any(n == "worker_ready" and f["worker"] == 1 for n, f in events)  # replaced
    assert PrivacyLedger(plan.request.ledger).spent(plan.dataset).releases == 1


def test_a_slow_ray_actor_that_makes_progress_is_not_killed(tmp_path, ray_instance):
    """Each chunk call takes longer than the timeout, but its steps move the probed count."""
    _, inline = run(tmp_path, ToyModel(vocab_size=30, eos_after=3), "inline.jsonl", num=4)
    slow = ToyModel(vocab_size=30, eos_after=3, step_delay=0.4)
    events: list[tuple[str, dict]] = []
    executor = RayExecutor(workers=1, chunk_size=2, stall_timeout_s=1.0,
                           events=lambda n, f: events.append((n, f)))
    _, got = run(tmp_path, slow, "ray.jsonl", executor, num=4)
    assert got == inline
    assert not [n for n, _ in events if n in ("worker_stalled", "worker_lost")]


def test_ray_actors_load_the_model_for_a_prompt_side_driver(tmp_path, ray_instance,
                                                           tiny_llama_dir):
    """The driver holds the tokenizer only; the actors load the transformers model (and decode
    in their default concurrency group's thread) and write the inline run's bytes."""
    from dplang.models import TransformersModel, resolve_prompt_side

    spec = str(tiny_llama_dir)
    _, inline = run(tmp_path, TransformersModel(tiny_llama_dir, threads=1), "inline.jsonl",
                    num=4, spec=spec)
    _, got = run(tmp_path, resolve_prompt_side(spec, threads=1), "ray.jsonl",
                 RayExecutor(workers=1), num=4, spec=spec)
    assert got == inline


def test_ray_actors_receive_no_seed_dataset_or_paths(tmp_path, ray_instance, worker_inbox):
    """Like the local executor's workers: an actor gets public calibrated parameters, its
    groups' prompts and stream states, never the root seed, the dataset name, the data path
    or the output path."""
    seed, dataset = 123456789, "secret-clinic-notes"
    data = tmp_path / "refs.csv"
    data.write_text("text\n" + "".join(f"review {i}: {'good ' * (i % 4)}\n" for i in range(36)))
    template = tmp_path / "t.toml"
    template.write_text('private = "Here: {reference}\\nAnother:"\npublic = "Another:"\n')
    req = GenerationRequest(data=data, out=tmp_path / "out-gen.jsonl", batch_size=3,
                            max_tokens=6, temperature=1.0, top_k=4, epsilon=10.0, seed=seed,
                            prompt=str(template), concurrent_groups=2, dataset=dataset,
                            ledger=tmp_path / "l.sqlite")
    plan = plan_generation(req, lambda _spec: ToyModel(vocab_size=30, eos_after=3))
    execute_plan(plan, executor=RayExecutor(workers=2))
    worker_inbox.assert_nothing_secret(plan, seed, dataset)
