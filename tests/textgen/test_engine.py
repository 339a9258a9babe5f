import numpy as np
import pytest
import torch

import dplang.textgen.methods.invisibleink as engine_mod
from dplang.models import ToyModel
from dplang.privacy import RandomStreams
from dplang.textgen.engine import DecodingParams, GroupJob, run_plain
from dplang.textgen.methods.invisibleink import run_invisibleink


def jobs(n, b=3, nulls=0):
    out = []
    for g in range(n):
        public = f"public prompt {g % 2}"
        private = [f"reference {g}-{i}" for i in range(b - nulls)] + [public] * nulls
        out.append(GroupJob(g, public, tuple(private)))
    return out


class CountingModel(ToyModel):
    """Toy model that records how many rows each decode step runs."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.rows_per_step = []

    def next_hidden(self, state, tokens):
        self.rows_per_step.append(state.rows if hasattr(state, "rows") else len(state.prompts))
        return super().next_hidden(state, tokens)


PARAMS = DecodingParams(clip=1.0, batch_size=3, temperature=1.0, top_k=4, max_tokens=12)


def texts(results):
    return {r.index: r.token_ids for r in results}


def test_same_text_for_any_concurrency_and_order():
    model = ToyModel(vocab_size=24, eos_after=6)
    base = texts(run_invisibleink(model, jobs(5), PARAMS, RandomStreams(3), 1))
    for g in (2, 3, 5, 8):
        assert texts(run_invisibleink(model, jobs(5), PARAMS, RandomStreams(3), g)) == base
    # resume: running only the last groups gives the same texts for them
    tail = texts(run_invisibleink(model, jobs(5)[3:], PARAMS, RandomStreams(3), 2))
    assert tail == {k: v for k, v in base.items() if k >= 3}
    other_seed = texts(run_invisibleink(model, jobs(5), PARAMS, RandomStreams(4), 2))
    assert other_seed != base


def test_sparse_and_dense_paths_agree():
    model = ToyModel(vocab_size=40, eos_after=None)
    dense = DecodingParams(1.0, 3, 1.0, 5, 10, sparse_head=False)
    a = texts(run_invisibleink(model, jobs(4), PARAMS.__class__(1.0, 3, 1.0, 5, 10),
                               RandomStreams(1), 4))
    b = texts(run_invisibleink(model, jobs(4), dense, RandomStreams(1), 4))
    assert a == b


def test_b_plus_one_rows_per_token_and_stops():
    model = CountingModel(vocab_size=20, eos_after=None)
    res = run_invisibleink(model, jobs(2), PARAMS, RandomStreams(0), 2)
    assert all(r.num_tokens == PARAMS.max_tokens and r.stopped == "length" for r in res)
    assert model.rows_per_step == [2 * (3 + 1)] * PARAMS.max_tokens
    assert all(r.stats["topk_plus_min"] >= PARAMS.top_k for r in res)
    assert all(r.stats["topk_plus_mean"] >= PARAMS.top_k for r in res)


def test_eos_ends_generation_and_retires_rows():
    model = CountingModel(vocab_size=20, eos_after=3)
    res = run_invisibleink(model, jobs(3), PARAMS, RandomStreams(0), 3)
    assert all(r.stopped == "eos" for r in res)
    assert all(model.eos_token_id not in r.token_ids for r in res)
    assert model.rows_per_step[0] == 12 and model.rows_per_step[-1] <= 12


def test_null_reference_gets_public_logits_exactly(monkeypatch):
    """Invariant 1: an empty reference never gets a row and contributes exactly φ_pub, so a
    group whose references are all empty samples from the public Top-k+ distribution."""
    model = CountingModel(vocab_size=30, eos_after=None)
    seen = []
    real = engine_mod.candidate_scores

    def spy(priv, pub, clip, b):
        seen.append((priv.shape[0], pub.clone(), real(priv, pub, clip, b)))
        return real(priv, pub, clip, b)

    monkeypatch.setattr(engine_mod, "candidate_scores", spy)
    run_invisibleink(model, jobs(1, b=3, nulls=3), PARAMS, RandomStreams(0), 1)
    assert model.rows_per_step[0] == 1  # only the public row is decoded
    for m, pub, scores in seen:
        assert m == 0
        assert np.array_equal(scores, pub.to(torch.float64).numpy())
    model.rows_per_step.clear()
    run_invisibleink(model, jobs(1, b=3, nulls=1), PARAMS, RandomStreams(0), 1)
    assert model.rows_per_step[0] == 3


def test_wrong_batch_size_refused():
    with pytest.raises(ValueError, match="references"):
        run_invisibleink(ToyModel(), jobs(1, b=2), PARAMS, RandomStreams(0), 1)
    with pytest.raises(ValueError):
        DecodingParams(1.0, 3, 0.0, 4, 10)


def test_run_plain_is_deterministic_and_respects_top_k():
    model = ToyModel(vocab_size=30, eos_after=None)
    a = run_plain(model, ["x", "y", "z"], 8, 1.0, 3, RandomStreams(2))
    b = run_plain(model, ["x", "y", "z"], 8, 1.0, 3, RandomStreams(2))
    assert a == b and all(len(t) == 8 for t in a)
    # every token is among the row's top-3 at its step
    for prompt, toks in zip(["x", "y", "z"], a, strict=True):
        for t, tok in enumerate(toks):
            logits = model.logits_for(prompt, toks[:t])
            assert tok in np.argsort(logits)[-3:]


def test_tiny_hf_model_sparse_dense_and_concurrency(tmp_path):
    from dplang.models import TransformersModel, make_tiny_hf_model

    make_tiny_hf_model(tmp_path / "m")
    model = TransformersModel(tmp_path / "m")
    js = [GroupJob(g, f"the public prompt {g}",
                   tuple(f"a private reference number {g} {i} with words" for i in range(3)))
          for g in range(3)]
    params = DecodingParams(1.0, 3, 1.0, 8, 6, stop_at_eos=False)
    base = texts(run_invisibleink(model, js, params, RandomStreams(0), 1))
    assert texts(run_invisibleink(model, js, params, RandomStreams(0), 3)) == base
    dense = DecodingParams(1.0, 3, 1.0, 8, 6, sparse_head=False, stop_at_eos=False)
    assert texts(run_invisibleink(model, js, dense, RandomStreams(0), 3)) == base


class StaggeredPolicy(engine_mod.InvisibleInkPolicy):
    """InvisibleInk that stops group ``g`` after ``g % 4 + 2`` tokens, so groups retire at
    different steps and the engine admits new ones mid-run."""

    def __init__(self, stop_after: int, *args) -> None:
        super().__init__(*args)
        self.stop_after = stop_after

    def choose(self, public, private, ids, rng):
        if len(self.sizes) >= self.stop_after:
            return None
        return super().choose(public, private, ids, rng)


def _staggered(model, groups, concurrent, vocab, prefix=""):
    from dplang.textgen.engine import run_groups

    def make(job):
        return StaggeredPolicy(job.index % 4 + 2, 1.0, 3, 1.0, 4, vocab)

    js = [GroupJob(j.index, prefix + j.public_prompt,
                   tuple(prefix + p for p in j.private_prompts), prefix) for j in jobs(groups)]
    return run_groups(model, js, make, 3, 12, RandomStreams(5), concurrent)


def test_continuous_batching_admits_a_group_as_one_retires():
    """With G = 2 and groups of different lengths, a third group starts before the first wave's
    longest group ends; every group's text is the one it gets decoded alone."""
    model = CountingModel(vocab_size=24, eos_after=None)
    alone = texts(_staggered(model, 5, 1, 24))
    model.rows_per_step.clear()
    together = _staggered(model, 5, 2, 24)
    assert texts(together) == alone
    assert [r.stopped for r in together] == ["budget"] * 5
    # Group g holds its rows for g % 4 + 3 steps (its tokens, then the step that stops it):
    # 3, 4, 5, 6, 3. Continuously, both slots stay full until the queue is empty: 11 steps of
    # 8 rows but the last; waves of 2 would take max(3, 4) + max(5, 6) + 3 = 13 steps.
    assert model.rows_per_step == [8] * 10 + [4]
    assert [r.index for r in together] == [0, 1, 2, 3, 4]


def test_tiny_hf_model_continuous_batching_is_bit_exact(tmp_path):
    """Staggered retirement over the real (row-invariant) backend: any G gives the texts of
    G = 1, because a newcomer's prompt rows and the others' token rows share calls without
    changing each other's bits."""
    from dplang.models import TransformersModel, make_tiny_hf_model

    make_tiny_hf_model(tmp_path / "m")
    model = TransformersModel(tmp_path / "m", block_size=4)
    for prefix in ("", "Here is a shared public header of the template: "):
        alone = texts(_staggered(model, 6, 1, model.vocab_size, prefix))
        for concurrent in (2, 3, 6):
            assert texts(_staggered(model, 6, concurrent, model.vocab_size, prefix)) == alone


def test_store_sized_once_for_prompts_and_tokens(tmp_path, monkeypatch):
    """The engine tells the backend how many tokens a row will generate: the key/value store
    is sized when the prompts run and never grows during the decode; the texts are those of a
    run without the hint (a capacity changes no bit)."""
    from dplang.models import TransformersModel, attention, make_tiny_hf_model

    make_tiny_hf_model(tmp_path / "m")
    model = TransformersModel(tmp_path / "m", block_size=4)
    resized: list[tuple[int, int]] = []
    real = attention.SlotCache._resize_to

    def counted(self, slots, capacity):
        resized.append((slots, capacity))
        real(self, slots, capacity)

    monkeypatch.setattr(attention.SlotCache, "_resize_to", counted)
    hinted = texts(_staggered(model, 2, 2, model.vocab_size))
    assert len(resized) == 1, resized
    resized.clear()
    monkeypatch.setattr(TransformersModel, "reserve_new_tokens", None)
    assert texts(_staggered(model, 2, 2, model.vocab_size)) == hinted
    assert len(resized) > 1  # without the hint the store grows as the rows lengthen
    # a hint far beyond any row (a max_tokens of 2**20) neither raises nor sizes the store
    # for it: at most MAX_HINTED_TOKENS positions of room
    from dplang.models import transformers as backend

    monkeypatch.undo()
    state = model.encode_prompts(["A short prompt", "Another one, a little longer"])
    model.reserve_new_tokens(state, 2**20)
    hidden = model.next_hidden(state, None)
    assert hidden.shape[0] == 2 and state.cache is not None
    assert state.cache.capacity <= 64 + backend.MAX_HINTED_TOKENS


def test_runner_shares_the_template_up_to_the_reference(tiny_gemma_dir):
    """The shared prefix is public: the rendered template up to the reference slot, as far as
    the public prompt agrees with it (completion form: the whole header, which is the public
    prompt; chat form: the chat header)."""
    from types import SimpleNamespace

    from dplang.models import TransformersModel
    from dplang.textgen.orchestration import _shared_prefix
    from dplang.textgen.prompts import get_template

    labels = {"label1": "Business Category: Restaurants", "label2": "Review Stars: 4.0"}
    for chat in (False, True):
        model = TransformersModel(tiny_gemma_dir, threads=1)
        if not chat:
            model.tokenizer.chat_template = None
        template = get_template("yelp", chat=chat)
        plan = SimpleNamespace(model=model, template=template)
        public = model.render_prompt(template.render(None, labels), template.system)
        private = model.render_prompt(template.render("Great tacos.", labels), template.system)
        prefix = _shared_prefix(plan, labels, public)
        assert prefix and public.startswith(prefix) and private.startswith(prefix)
        assert "Great tacos" not in prefix
        if not chat:
            assert prefix == public  # the completion form's public prompt is its header
        else:
            assert prefix.startswith("<bos>") and len(prefix) < len(public)
