import numpy as np
import pytest
import torch

from dplang.privacy.audit import renyi_divergence
from dplang.textgen.distributions import softmax64
from dplang.textgen.methods import adapmixed as ada


def dists(seed, b=4, v=50):
    g = torch.Generator().manual_seed(seed)
    public = torch.randn(v, generator=g, dtype=torch.float64) * 2
    private = public + torch.randn(b, v, generator=g, dtype=torch.float64)
    return public, private


def test_renyi_matches_audit():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(30)), rng.dirichlet(np.ones(30))
    for a in (1.5, 15.0):
        assert ada.renyi(p, q, a) == pytest.approx(renyi_divergence(p, q, a), rel=1e-9)


def test_mixing_weight_hits_the_target():
    public, private = dists(1)
    p_pub = softmax64(public, 1.0)
    far = softmax64(public + 6 * (private[0] - public), 1.0)
    lam = ada.mixing_weight(p_pub, far, 15.0, 0.3)
    assert 1e-5 < lam < 1 - 1e-5
    mix = (1 - lam) * p_pub + lam * far
    assert ada.renyi_sym(p_pub, mix, 15.0) == pytest.approx(0.3 * 15.0, rel=1e-4)
    # a reference too close to the public distribution for the target gets the largest weight
    near = softmax64(public + 1e-3 * (private[0] - public), 1.0)
    assert ada.mixing_weight(p_pub, near, 15.0, 0.3) == pytest.approx(1 - 1e-5)


@pytest.mark.audits("adapmixed")
@pytest.mark.parametrize("adjacency", ["replace-by-null", "add-remove"])
def test_charged_cost_is_the_exact_divergence_to_neighbours(adjacency):
    """The per-step charge equals max over neighbours of the exact symmetric Rényi divergence
    between the output laws; the other adjacency's formula does not (caught)."""
    public, private = dists(2)
    b = private.shape[0]
    prm = ada.AdaPMixEDParams(epsilon=1e9, screen_threshold=1e9, adjacency=adjacency)
    pol = ada.AdaPMixEDPolicy(prm, b)
    pol.choose(public, private, None, np.random.default_rng(0))
    screening = prm.alpha * (prm.mix_lambda / (b * prm.sigma)) ** 2
    charged = pol.cost - screening
    p_pub = softmax64(public, 1.0)
    refs = softmax64(private, 1.0)
    lams = [ada.mixing_weight(p_pub, refs[i], prm.alpha, prm.beta) for i in range(b)]
    mixes = np.stack([(1 - lam) * p_pub + lam * refs[i] for i, lam in enumerate(lams)])
    p = mixes.mean(0)

    def neighbour(i, adj):
        rest = np.delete(mixes, i, axis=0)
        return rest.mean(0) if adj == "add-remove" else (rest.sum(0) + p_pub) / b

    exact = max(max(renyi_divergence(neighbour(i, adjacency), p, prm.alpha),
                    renyi_divergence(p, neighbour(i, adjacency), prm.alpha)) for i in range(b))
    assert charged == pytest.approx(exact, rel=1e-9)
    other = "add-remove" if adjacency == "replace-by-null" else "replace-by-null"
    wrong = max(ada.renyi_sym(neighbour(i, other), p, prm.alpha) for i in range(b))
    assert wrong != pytest.approx(exact, rel=1e-3)


@pytest.mark.audits("adapmixed")
def test_budget_stops_generation_and_guarantee_is_data_dependent():
    public, private = dists(3)
    prm = ada.AdaPMixEDParams(epsilon=1.3, screen_threshold=1e9)
    pol = ada.AdaPMixEDPolicy(prm, private.shape[0])
    rng = np.random.default_rng(0)
    steps = 0
    while pol.choose(public, private, None, rng) is not None:
        steps += 1
        assert steps < 10_000
    assert prm.epsilon_of(pol.cost) <= prm.epsilon
    # the exact, data-dependent cost is not published (it differs between neighbours)
    assert not {"rdp_cost", "epsilon_spent"} & set(pol.stats())
    g = prm.guarantee()
    assert not g.ex_ante and "DATA-DEPENDENT" in g.summary()
    assert "does NOT satisfy differential privacy" in g.summary()
    with pytest.raises(ValueError):
        ada.AdaPMixEDParams(epsilon=1.0, adjacency="zero-out")
