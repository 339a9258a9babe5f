"""A fixed seed never lets two releases share their noise.

Every releasing command (generate, report, sample, formal run, experiment cells) draws its noise
from streams rooted at H(seed, release id), never at the seed itself, so two releases made
with one seed — other parameters, other statements, edited data — have independent noise
(differencing them cancels nothing); and the ledger refuses a seed already used for another
release of the same dataset. The same command on the same data with the same seed is the same
release (reproducible, charged once)."""

from __future__ import annotations

import pytest

import dplang.cli.generate as gen_cli
from dplang.cli.app import main
from dplang.models import ToyModel
from dplang.privacy import randomness
from dplang.privacy.ledger import PrivacyLedger

SEED = 42


@pytest.fixture
def roots(monkeypatch):
    """The root of every ``RandomStreams`` a command builds (where all its noise comes from)."""
    seen: list[int] = []
    init = randomness.RandomStreams.__init__

    def record(self, seed, *, os_entropy=False):
        init(self, seed, os_entropy=os_entropy)
        seen.append(self._root)

    monkeypatch.setattr(randomness.RandomStreams, "__init__", record)
    return seen


def cli(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


# --------------------------------------------------------------------------- the commands


def reviews(path, blank=None, n=200):
    lines = ["text"]
    for i in range(n):
        text = "the soup was great" if i % 3 == 0 else "slow service" if i % 3 == 1 else "ok"
        lines.append("" if i == blank else text)
    path.write_text("\n".join(lines) + "\n")
    return path


def statements(path, second="slow"):
    path.write_text(f"Soup is great\tsoup\nService is slow\t{second}\n")
    return path


def report(capsys, tmp_path, data, stmts, out, dataset, *extra):
    return cli(capsys, "report", "--data", str(data), "--statements", str(stmts),
               "--predicate", "keyword", "--epsilon", "1", "--threshold", "0.2", "--seed",
               str(SEED), "--out", str(tmp_path / out), "--dataset", dataset, *extra)


def test_report_noise_is_fresh_per_release_and_a_reused_seed_is_refused(tmp_path, capsys,
                                                                        roots):
    """Two reports with one seed and statement files that differ in one predicate draw
    different noise (with the very same noise their lower bounds would differ by exactly the
    count of the records both predicates hold): each release's streams are its own, and the
    ledger refuses the second release of the dataset with that seed."""
    data = reviews(tmp_path / "d.csv")
    a, b = statements(tmp_path / "a.txt"), statements(tmp_path / "b.txt", second="slow|ok")
    assert report(capsys, tmp_path, data, a, "ra", "clinic")[0] == 0
    first = list(roots)
    assert first and SEED not in first
    code, _, err = report(capsys, tmp_path, data, b, "rb", "clinic")
    assert code == 3 and "seed was already used" in err
    assert not (tmp_path / "rb.json").exists()
    assert PrivacyLedger().spent("clinic").releases == 1
    # under another dataset name the ledger cannot compare seeds, but the noise is fresh
    roots.clear()
    assert report(capsys, tmp_path, data, b, "rc", "clinic-copy")[0] == 0
    assert roots and not set(roots) & set(first)
    # neighbouring data (one row blanked), same seed, other name: fresh noise as well
    roots.clear()
    neighbour = reviews(tmp_path / "n.csv", blank=0)
    assert report(capsys, tmp_path, neighbour, a, "rn", "clinic-n")[0] == 0
    assert roots and not set(roots) & set(first)
    # the same release again (same data, statements and seed) is reproducible, charged once
    roots.clear()
    assert report(capsys, tmp_path, data, a, "ra", "clinic", "--overwrite")[0] == 0
    assert roots == first and PrivacyLedger().spent("clinic").releases == 1


@pytest.fixture
def toy(monkeypatch):
    model = ToyModel(vocab_size=30, eos_after=None)
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": model)
    return model


def generate(capsys, data, out, *extra):
    template = data.parent / "t.toml"
    template.write_text('private = "Here: {reference}\\nAnother:"\npublic = "Another:"\n')
    return cli(capsys, "generate", "--data", str(data), "--out", str(out), "--epsilon", "5",
               "--batch-size", "3", "--max-tokens", "4", "--top-k", "4", "--seed", str(SEED),
               "--prompt", str(template), "--dataset", "reviews", "--quiet", *extra)


def test_generate_overwrite_with_the_same_seed_on_edited_data_is_refused(tmp_path, capsys,
                                                                        toy, roots):
    data = reviews(tmp_path / "d.csv", n=12)
    out = tmp_path / "g.jsonl"
    assert generate(capsys, data, out)[0] == 0
    first = list(roots)
    assert first and SEED not in first
    before = out.read_bytes()
    reviews(data, blank=4, n=12)  # one reference edited in place
    code, _, err = generate(capsys, data, out, "--overwrite")
    assert code == 3 and "seed was already used" in err
    assert out.read_bytes() == before  # nothing replaced
    # another parameter with the same seed: refused too
    code, _, err = generate(capsys, data, tmp_path / "h.jsonl", "--temperature", "0.9")
    assert code == 3 and "seed was already used" in err
    assert PrivacyLedger().spent("reviews").releases == 1


def sample(capsys, tmp_path, data, out, *extra):
    return cli(capsys, "sample", "--data", str(data), "--columns", "color", "--domain",
               "color=red,green,blue", "--epsilon", "1", "--num", "2", "--seed", str(SEED),
               "--dataset", "colours", "--out", str(tmp_path / out), *extra)


def test_sample_with_a_reused_seed(tmp_path, capsys, roots):
    data = tmp_path / "colours.csv"
    data.write_text("color\n" + "".join(f"{['red', 'green', 'blue'][i % 3]}\n"
                                        for i in range(60)))
    assert sample(capsys, tmp_path, data, "a.csv")[0] == 0
    assert roots and SEED not in roots
    first = list(roots)
    code, _, err = sample(capsys, tmp_path, data, "b.csv", "--method", "laplace")
    assert code == 3 and "seed was already used" in err
    roots.clear()
    code, _, err = sample(capsys, tmp_path, data, "c.csv")  # the same release
    assert code == 0, err
    assert roots == first


def test_formal_run_with_a_reused_seed(tmp_path, capsys, roots):
    data = tmp_path / "s.txt"
    data.write_text("\n".join(map(str, [0] * 30 + [1] * 5 + [3] * 2)) + "\n")

    def run(out, epsilon):
        return cli(capsys, "formal", "run", "prefix-count", "--instance", "remark-5.7",
                   "--epsilon", epsilon, "--data", str(data), "--out", str(tmp_path / out),
                   "--seed", str(SEED), "--dataset", "naturals")

    assert run("a", "1")[0] == 0
    assert roots and SEED not in roots
    code, _, err = run("b", "2")
    assert code == 3 and "seed was already used" in err


def test_stream_seed_depends_on_the_release_and_the_ledger_tags_seeds(tmp_path):
    """The stream root is a function of (seed, release id); coupled runs (audits) share it."""
    from dplang.privacy.ledger import SeedReused
    from dplang.release import make_stream_seed

    roots = {make_stream_seed(SEED, rid) for rid in ("a" * 64, "b" * 64)}
    assert len(roots) == 2 and SEED not in roots
    assert make_stream_seed(SEED, "a" * 64, "audit") == make_stream_seed(SEED, "b" * 64, "audit")
    from dplang.privacy import Guarantee

    g = Guarantee("x", "record", "replace-one", None, 1.0, 0.0)
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    assert ledger.charge("d", "r1", g, seed_tag="t")
    assert not ledger.charge("d", "r1", g, seed_tag="t")  # the same release: resumed
    with pytest.raises(SeedReused):
        ledger.charge("d", "r2", g, seed_tag="t")
    assert ledger.charge("other", "r3", g, seed_tag="t")  # tags are per dataset
    assert ledger.charge("d", "r4", g)  # no tag (a toy run): nothing to compare



EXPERIMENT = """
name = "seeded"
[data]
path = "d.csv"
references = [0, 12]
real = [12, 24]
prompt = "t.toml"
[generation]
model = "toy"
max_tokens = 4
num = 4
[sweep]
methods = ["invisibleink"]
epsilon = [5]
batch_size = [3]
top_k = [3, 5]
temperature = [1.0]
seeds = [42]
public_baseline = false
[evaluation]
metrics = ["topk"]
embedder = "hashing"
"""


def test_experiment_cells_with_one_written_seed_draw_independent_noise(tmp_path, capsys,
                                                                      monkeypatch, roots):
    """`seeds = [42]` gives every cell the seed 42; each cell is its own release, so each
    draws from its own streams (and the cells are toy runs: tests/experiments)."""
    import dplang.cli.experiment as exp_cli

    model = ToyModel(vocab_size=30, eos_after=None)
    monkeypatch.setattr(exp_cli, "_load_model", lambda spec, dtype="float32": model)
    monkeypatch.setattr(exp_cli, "_check_model", lambda spec: None)
    (tmp_path / "d.csv").write_text("text\n" + "".join(f"review {i} of the soup\n"
                                                       for i in range(30)))
    (tmp_path / "t.toml").write_text('private = "Here: {reference}\\nAnother:"\n'
                                     'public = "Another:"\n')
    (tmp_path / "exp.toml").write_text(EXPERIMENT)
    assert main(["experiment", str(tmp_path / "exp.toml"), "--out", str(tmp_path / "o"),
                 "-q"]) == 0, capsys.readouterr().err
    generation_roots = [r for r in roots if r != 42]
    assert 42 not in roots and len(set(generation_roots)) >= 2
