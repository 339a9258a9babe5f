"""The batched InvisibleInk step decides every group exactly as its policy alone would.

Each test compares bits with the per-group reference (:class:`InvisibleInkPolicy`): the
privacy contract of :mod:`dplang.textgen.methods.invisibleink_batch` is that equality, so that
a group's token depends on its own rows and stream only, whatever the batch around it.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dplang.models import ToyModel, kernels
from dplang.privacy import RandomStreams
from dplang.textgen.engine import DecodingParams, GroupJob, run_groups
from dplang.textgen.methods.invisibleink import (
    InvisibleInkPolicy,
    candidate_scores,
    expanded_topk_mask,
    grid_exponent,
    run_invisibleink,
)
from dplang.textgen.methods.invisibleink_batch import (
    BatchSettings,
    GroupBatchStep,
    batched_scores,
    ceil_log2,
    masked_ids,
    power_of_two,
    topk_plus_mask,
)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64)


def test_exact_power_of_two_and_ceil_log2():
    e = torch.arange(-1022, 1024)
    assert torch.equal(power_of_two(e), torch.tensor([math.ldexp(1.0, int(k)) for k in e],
                                                     dtype=torch.float64))
    values = [1.0, 1.5, 2.0, 3.0, 1024.0, 1024.0 * (1 + 2**-52), 1023.9999999, 7 * 36.5,
              2.0**-40, 5e300]
    got = ceil_log2(torch.tensor(values, dtype=torch.float64)).tolist()
    assert got == [math.ceil(math.log2(v)) if v != 1024.0 * (1 + 2**-52) else 11
                   for v in values]
    # the grid exponent is this exact function (math.log2 rounds just above a power of two)
    assert grid_exponent(1022.5 + 2**-42, 0.5, 1) == 40  # bound 1024 + 2^-42


def _group_data(rng, sizes, width, m_rows, clip, special=True):
    """Public logits on padded candidates and private rows, with awkward values."""
    public_on = rng.normal(0, 8, size=(len(sizes), width)).astype(np.float32)
    owner = np.concatenate([np.full(m, g) for g, m in enumerate(m_rows)]).astype(np.int64)
    private = (public_on[owner] + rng.normal(0, 2 * clip + 0.1, size=(owner.size, width))
               ).astype(np.float32)
    if special and owner.size:
        flat = private.reshape(-1)
        picks = rng.choice(flat.size, size=min(6, flat.size), replace=False)
        flat[picks] = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0])[: picks.size]
    return public_on, private, owner


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), groups=st.integers(1, 6), batch=st.integers(1, 8),
       clip=st.sampled_from([0.05, 0.5, 1.0, 3.7, 40.0]))
def test_batched_scores_are_candidate_scores_bit_for_bit(seed, groups, batch, clip):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 12, size=groups)
    width = int(sizes.max()) + int(rng.integers(0, 4))
    m_rows = rng.integers(0, batch + 1, size=groups)
    public_on, private, owner = _group_data(rng, sizes, width, m_rows, clip)
    got = batched_scores(torch.from_numpy(private), torch.from_numpy(owner),
                         torch.from_numpy(public_on), torch.from_numpy(sizes), clip, batch)
    assert got.dtype == torch.float64
    for g in range(groups):
        n = int(sizes[g])
        alone = candidate_scores(torch.from_numpy(private[owner == g, :n]),
                                 torch.from_numpy(public_on[g, :n]), clip, batch)
        np.testing.assert_array_equal(_bits(got[g, :n].numpy()), _bits(alone))


def test_batched_scores_of_a_certain_public_row_are_uniform():
    public_on = torch.tensor([[np.inf, np.inf, 0.0], [1.0, 2.0, 3.0]], dtype=torch.float32)
    private = torch.tensor([[5.0, -5.0, 1.0], [0.5, 0.5, 0.5]])
    got = batched_scores(private, torch.tensor([0, 1]), public_on, torch.tensor([2, 3]), 1.0, 2)
    assert got[0, :2].tolist() == [0.0, 0.0]
    alone = candidate_scores(private[1:], public_on[1], 1.0, 2)
    np.testing.assert_array_equal(_bits(got[1].numpy()), _bits(alone))


def _public_rows(rng, groups, vocab):
    rows = rng.normal(0, 3, size=(groups, vocab)).astype(np.float32)
    rows[:, rng.integers(0, vocab, size=3)] = rows[:, :1]  # ties
    if groups > 1:
        rows[1, rng.integers(0, vocab, size=4)] = np.nan
        rows[1, rng.integers(0, vocab, size=4)] = -np.inf
    if groups > 2:
        rows[2, rng.integers(0, vocab, size=2)] = np.inf  # the +inf tokens only
    return torch.from_numpy(rows)


@pytest.mark.parametrize("top_k", [1, 3, 17])
def test_topk_plus_rows_are_each_rows_own_set(top_k):
    rng = np.random.default_rng(top_k)
    public = _public_rows(rng, 5, 64)
    mask = topk_plus_mask(public, top_k, 1.3, 3)
    for g in range(public.shape[0]):
        assert torch.equal(mask[g], expanded_topk_mask(public[g], top_k, 1.3, 3))
    width = int(mask.sum(-1).max())
    ids = masked_ids(mask, width + 3)
    for g in range(public.shape[0]):
        real = torch.nonzero(mask[g]).squeeze(-1)
        assert torch.equal(ids[g, : real.numel()], real)
        assert bool((ids[g, real.numel():] == real[0]).all())  # padded by the first id
    fused = kernels.lookup("topk_plus", public)
    if fused is not None:  # the CPU kernel gives the same rows
        for g in range(public.shape[0]):
            assert torch.equal(fused(public[g], top_k, 1.3, 3),
                               torch.nonzero(mask[g]).squeeze(-1))
    rows = kernels.lookup("topk_plus_rows", public)
    if rows is not None:  # and its parallel form, all rows at once (with an empty row)
        empty = torch.full((1, public.shape[1]), -math.inf)
        ids, sizes = rows(torch.cat([public, empty]), top_k, 1.3, 3)
        full = torch.cat([mask, torch.zeros_like(mask[:1])])
        assert sizes.tolist() == full.sum(-1).tolist()
        assert ids.shape[1] == int(sizes.max())
        for g in range(public.shape[0]):
            n = int(sizes[g])
            assert torch.equal(ids[g, :n], torch.nonzero(full[g]).squeeze(-1))
            assert bool((ids[g, n:] == ids[g, 0]).all())
        assert bool((ids[-1] == 0).all())


def _jobs(n, nulls=0):
    """n groups of 3 references (the last ``nulls`` of them empty: the public prompt)."""
    return [GroupJob(g, f"public prompt {g % 2}",
                     (*(f"reference {g}-{i}" for i in range(3 - nulls)),
                      *[f"public prompt {g % 2}"] * nulls)) for g in range(n)]


class PerGroup(InvisibleInkPolicy):
    """InvisibleInk decided group by group (the reference): it opts out of batching."""

    def batch_settings(self):
        return None


def _texts(results):
    return {r.index: (r.token_ids, r.stats) for r in results}


@pytest.mark.parametrize("definitions", [False, True])
def test_engine_tokens_and_statistics_equal_the_per_group_path(definitions):
    model = ToyModel(vocab_size=48, eos_after=7)
    params = DecodingParams(0.8, 3, 1.1, 5, 10)
    jobs = [*_jobs(6, nulls=1), GroupJob(9, "public prompt 1", ("public prompt 1",) * 3)]

    def run(policy_type, concurrent):
        def make(_job):
            return policy_type(0.8, 3, 1.1, 5, model.vocab_size)
        return _texts(run_groups(model, jobs, make, 3, 10, RandomStreams(7), concurrent))

    reference = run(PerGroup, 1)
    if definitions:
        with kernels.definitions_only():  # the batched top-k and mask, not the CPU kernel
            assert run(InvisibleInkPolicy, 4) == reference
    else:
        for concurrent in (1, 3, 7):
            assert run(InvisibleInkPolicy, concurrent) == reference
    assert texts_of(run_invisibleink(model, jobs, params, RandomStreams(7), 4)) == {
        k: v[0] for k, v in reference.items()}


def texts_of(results):
    return {r.index: r.token_ids for r in results}


def test_a_fixed_width_grows_and_recomputes_the_step():
    """The GPU's way (a kept width, no synchronisation to size it): a step whose sets do not
    fit is recomputed wider, with the same tokens."""
    model = ToyModel(vocab_size=300, eos_after=None)
    rng = np.random.default_rng(0)
    settings_ = BatchSettings(2.0, 3, 1.0, 40)
    hidden = torch.from_numpy(rng.normal(0, 2, size=(8, 300)).astype(np.float32))
    public = hidden[[3, 7]]
    draws = {}
    for fixed, width in ((False, 0), (True, 1), (True, 64)):
        step = GroupBatchStep(settings_, width=width, fixed_width=fixed)
        groups = [([0, 1, 2], InvisibleInkPolicy(2.0, 3, 1.0, 40, 300), RandomStreams(1)
                   .generator(0)),
                  ([4, 5, 6], InvisibleInkPolicy(2.0, 3, 1.0, 40, 300), RandomStreams(1)
                   .generator(1))]
        with kernels.definitions_only():
            draws[(fixed, width)] = step.choose(model, hidden, public, groups)
        if fixed:
            assert step.width >= 40 and step.width % 64 == 0
    assert len(set(map(tuple, draws.values()))) == 1


def test_one_groups_token_does_not_depend_on_the_groups_beside_it():
    """Group A decided alone, beside a group with a small set, beside one with a huge set
    (the padding width changes): the same token and the same law."""
    vocab = 4096
    rng = np.random.default_rng(3)
    model = ToyModel(vocab_size=vocab, eos_after=None)
    a = torch.from_numpy(rng.normal(0, 4, size=(3, vocab)).astype(np.float32))
    small = torch.from_numpy(rng.normal(0, 4, size=(3, vocab)).astype(np.float32))
    flat = torch.zeros((3, vocab))  # every public logit equal: the whole vocabulary is V_k^+
    seen = []
    for other in (None, small, flat):
        hidden = a if other is None else torch.cat([a, other])
        public = hidden[[2]] if other is None else hidden[[2, 5]]
        laws = []
        policy_a = InvisibleInkPolicy(1.0, 3, 1.0, 8, vocab,
                                      observer=lambda i, s, t, laws=laws: laws.append((i, s)))
        groups = [([0, 1], policy_a, RandomStreams(2).generator(0))]
        if other is not None:
            groups.append(([3, 4], InvisibleInkPolicy(1.0, 3, 1.0, 8, vocab),
                           RandomStreams(2).generator(1)))
        for definitions in (False, True):
            laws.clear()
            policy_a.sizes.clear()
            groups[0] = (groups[0][0], policy_a, RandomStreams(2).generator(0))
            if definitions:
                with kernels.definitions_only():
                    token = GroupBatchStep(BatchSettings(1.0, 3, 1.0, 8)).choose(
                        model, hidden, public, groups)[0]
            else:
                token = GroupBatchStep(BatchSettings(1.0, 3, 1.0, 8)).choose(
                    model, hidden, public, groups)[0]
            seen.append((token, laws[0][0].tobytes(), _bits(laws[0][1]).tobytes()))
    assert len(set(seen)) == 1


def test_subclasses_that_change_the_decision_are_not_batched():
    class OwnScores(InvisibleInkPolicy):
        def scores(self, public, private, ids):
            return super().scores(public, private, ids)

    assert InvisibleInkPolicy(1.0, 2, 1.0, 4, 10).batch_settings() == BatchSettings(1.0, 2, 1.0,
                                                                                     4)
    assert OwnScores(1.0, 2, 1.0, 4, 10).batch_settings() is None
    assert InvisibleInkPolicy(1.0, 2, 1.0, 0, 10).batch_settings() is None  # full vocabulary


def test_a_public_row_that_allows_nothing_is_refused():
    model = ToyModel(vocab_size=16, eos_after=None)
    hidden = torch.zeros((2, 16))
    hidden[1] = -math.inf
    groups = [([0], InvisibleInkPolicy(1.0, 2, 1.0, 4, 16), RandomStreams(0).generator(0))]
    for definitions in (False, True):
        step = GroupBatchStep(BatchSettings(1.0, 2, 1.0, 4))
        with pytest.raises(ValueError, match="allow no token"):
            if definitions:
                with kernels.definitions_only():
                    step.choose(model, hidden, hidden[[1]], groups)
            else:
                step.choose(model, hidden, hidden[[1]], groups)


@pytest.mark.gpu
def test_on_a_gpu_the_batched_step_gives_the_cpus_sets_scores_and_tokens():
    """The device changes nothing: sets, score bits and tokens as on the CPU."""
    rng = np.random.default_rng(11)
    vocab, groups = 2048, 6
    model = ToyModel(vocab_size=vocab, eos_after=None)
    hidden = torch.from_numpy(rng.normal(0, 3, size=(groups * 3, vocab)).astype(np.float32))
    public = hidden[[3 * g + 2 for g in range(groups)]]
    sizes = torch.from_numpy(rng.integers(1, 40, size=groups))
    public_on = public[:, :40].contiguous()
    private = hidden[:, :40].contiguous()
    owner = torch.arange(groups * 3) // 3
    cpu = batched_scores(private, owner, public_on, sizes, 0.9, 3)
    gpu = batched_scores(private.cuda(), owner.cuda(), public_on.cuda(), sizes.cuda(), 0.9, 3)
    np.testing.assert_array_equal(_bits(cpu.numpy()), _bits(gpu.cpu().numpy()))
    assert torch.equal(topk_plus_mask(public, 30, 0.9, 3).cpu(),
                       topk_plus_mask(public.cuda(), 30, 0.9, 3).cpu())

    def tokens(pub):
        groups_ = [([3 * g, 3 * g + 1], InvisibleInkPolicy(0.9, 3, 1.0, 30, vocab),
                    RandomStreams(4).generator(g)) for g in range(groups)]
        return GroupBatchStep(BatchSettings(0.9, 3, 1.0, 30)).choose(model, hidden, pub,
                                                                     groups_)

    with kernels.definitions_only():
        assert tokens(public.cuda()) == tokens(public)


# ---- found by an adversarial review of the batched step (each failed before its fix) ----


class _ScalarDivisions(torch.overrides.TorchFunctionMode):
    """Records divisions whose divisor is a host number: a GPU computes those as a
    multiplication by the reciprocal (PyTorch's CUDA kernel), not correctly rounded."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("div", "true_divide", "__truediv__", "div_") and len(args) > 1 \
                and not isinstance(args[1], torch.Tensor):
            self.seen.append(name)
        return func(*args, **kwargs)


def test_the_scores_divide_by_b_as_a_tensor_on_the_device():
    mode = _ScalarDivisions()
    with mode:
        batched_scores(torch.ones((2, 3)), torch.tensor([0, 1]), torch.zeros((2, 3)),
                       torch.tensor([3, 3]), 1.0, 3)
    assert mode.seen == []


def test_no_negative_zero_scores_on_either_path():
    """A public logit that rounds to −0 on the grid (beside a huge one): both paths give +0.0,
    and the same bits (numpy's sum starts at +0.0, an index_add at the −0.0 it adds to)."""
    pub = torch.tensor([[3e38, -1.0, -2.0, -0.0]])
    priv = torch.tensor([[3e38, -1.5, -2.5, -0.0]])
    batched = batched_scores(priv, torch.tensor([0]), pub, torch.tensor([4]), 1.0, 2)[0].numpy()
    alone = candidate_scores(priv, pub[0], 1.0, 2)
    np.testing.assert_array_equal(_bits(batched), _bits(alone))
    assert not np.signbit(alone[alone == 0]).any()
    empty = candidate_scores(torch.empty((0, 4)), pub[0], 1.0, 2)
    assert not np.signbit(empty[empty == 0]).any()


def test_a_clip_norm_beyond_the_grid_is_decided_group_by_group():
    """B·(max|φ_pub| + C + 1) must be finite: a policy whose C could overflow it is not
    batched, so each group refuses (or not) by its own logits, as alone."""
    assert InvisibleInkPolicy(1.7e308, 2, 1.0, 3, 8).batch_settings() is None
    assert InvisibleInkPolicy(1e30, 2, 1.0, 3, 8).batch_settings() is not None


def test_plus_infinity_keeps_its_tokens_when_the_margin_overflows_float32():
    pub = torch.tensor([[0.0, float("inf"), 1.0, 2.0], [0.0, 1.0, 3.0, 2.0]])
    with kernels.definitions_only():
        mask = topk_plus_mask(pub, 1, 1e39, 2)
    assert mask[0].nonzero().flatten().tolist() == [1]
    assert expanded_topk_mask(pub[0], 1, 1e39, 2).nonzero().flatten().tolist() == [1]
    fused = kernels.lookup("topk_plus", pub[0])
    if fused is not None:
        assert fused(pub[0], 1, 1e39, 2).tolist() == [1]


def test_a_refused_step_draws_nothing_and_too_many_rows_are_refused():
    model = ToyModel(vocab_size=16, eos_after=None)
    hidden = torch.zeros((3, 16))
    hidden[2] = -math.inf  # group 1's public row allows nothing
    drawn = []
    first = InvisibleInkPolicy(1.0, 2, 1.0, 4, 16, observer=lambda *a: drawn.append(a))
    rng = RandomStreams(0).generator(0)
    before = rng.bit_generator.state
    groups = [([0], first, rng),
              ([], InvisibleInkPolicy(1.0, 2, 1.0, 4, 16), RandomStreams(0).generator(1))]
    for definitions in (False, True):
        step = GroupBatchStep(BatchSettings(1.0, 2, 1.0, 4))
        with pytest.raises(ValueError, match="allow no token"):
            if definitions:
                with kernels.definitions_only():
                    step.choose(model, hidden, hidden[[1, 2]], groups)
            else:
                step.choose(model, hidden, hidden[[1, 2]], groups)
        assert drawn == [] and rng.bit_generator.state == before
    with pytest.raises(ValueError, match="private rows for a batch of 2"):
        GroupBatchStep(BatchSettings(1.0, 2, 1.0, 4)).choose(
            model, hidden, hidden[[1]], [([0, 1, 2], first, rng)])


def test_a_kept_width_far_above_the_sets_shrinks():
    model = ToyModel(vocab_size=2048, eos_after=None)
    rng = np.random.default_rng(5)
    hidden = torch.from_numpy(rng.normal(0, 3, size=(4, 2048)).astype(np.float32))
    tokens = []
    for width in (0, 1024):
        step = GroupBatchStep(BatchSettings(0.5, 3, 1.0, 8), width=width, fixed_width=True)
        groups = [([0, 1], InvisibleInkPolicy(0.5, 3, 1.0, 8, 2048),
                   RandomStreams(3).generator(0))]
        with kernels.definitions_only():
            tokens.append(step.choose(model, hidden, hidden[[2]], groups))
        assert step.width == 64
    assert tokens[0] == tokens[1]


def test_instance_level_changes_opt_out_of_batching():
    policy = InvisibleInkPolicy(1.0, 2, 1.0, 4, 10)
    policy.scores = lambda *a: None  # a patched decision: batching would bypass it
    assert policy.batch_settings() is None


class SupersetToy(ToyModel):
    """A toy whose public rows come as logits on a superset of their Top-k+ sets (what the
    default model's bounded LM head returns): every token the rule could keep, plus random
    others, and nothing banned."""

    def __init__(self, *args, extra=0.3, seed=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.extra, self.calls = extra, 0
        self._rng = np.random.default_rng(seed)

    def top_superset_logits(self, hidden, top_k, margin, banned=None):
        self.calls += 1
        logits = self.logits_from_hidden(hidden)
        if banned is not None:
            logits[:, banned] = -math.inf
        ell = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        threshold = ell - np.float32(margin)  # float32, as the rule
        sets = []
        for g in range(logits.shape[0]):
            keep = (logits[g] >= threshold[g]).numpy()
            keep |= self._rng.random(keep.size) < self.extra
            keep &= np.isfinite(logits[g].numpy())  # banned tokens are never in the set
            sets.append(np.flatnonzero(keep))
        width = max(len(s) for s in sets)
        ids = torch.tensor(np.stack([np.concatenate([s, np.full(width - len(s), s[0])])
                                     for s in sets]), dtype=torch.int64)
        sizes = torch.tensor([len(s) for s in sets], dtype=torch.int64)
        return ids, sizes, logits.gather(1, ids)


@pytest.mark.parametrize("extra", [0.0, 0.05, 0.5])
def test_a_superset_of_the_public_sets_gives_the_same_tokens(extra):
    """The engine's step from the public rows' logits on supersets of their Top-k+ sets (any
    superset: the rule picks the same set from it) draws the same tokens as from every
    public logit, with banned tokens."""
    params = DecodingParams(0.6, 3, 1.1, 5, 12)
    jobs = [*_jobs(5, nulls=1), GroupJob(9, "public prompt 1", ("public prompt 1",) * 3)]
    plain = ToyModel(vocab_size=300, eos_after=7)
    superset = SupersetToy(vocab_size=300, eos_after=7, extra=extra)
    reference = _texts(run_invisibleink(plain, jobs, params, RandomStreams(4), 3))
    # the same tokens and the same statistics (|V_k^+| of every step)
    assert _texts(run_invisibleink(superset, jobs, params, RandomStreams(4), 3)) == reference
    assert superset.calls > 0
    # with banned tokens (the engine's ban list), through the per-step superset
    banned = torch.tensor([3, 17, 250])
    step = GroupBatchStep(BatchSettings(0.6, 3, 1.1, 5))
    rng = np.random.default_rng(2)
    hidden = torch.from_numpy(rng.normal(0, 3, size=(8, 300)).astype(np.float32))
    hidden[3, 17] = 40.0  # a banned token far above the rest of its public row
    public = hidden[[3, 7]].clone()
    public[:, banned] = -math.inf

    def groups():
        return [([0, 1, 2], InvisibleInkPolicy(0.6, 3, 1.1, 5, 300),
                 RandomStreams(1).generator(0)),
                ([4, 5, 6], InvisibleInkPolicy(0.6, 3, 1.1, 5, 300),
                 RandomStreams(1).generator(1))]

    want = step.choose(plain, hidden, public, groups())
    margin = float(np.float32(2 * 0.6 / 3))
    found = superset.top_superset_logits(hidden[[3, 7]], 5, margin, banned)
    assert step.choose_in_superset(plain, hidden, found, groups()) == want

