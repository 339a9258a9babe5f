"""The metric registry: a new metric is one registered spec; the harness and the report only
loop over specs."""

from __future__ import annotations

import numpy as np
import pytest

from dplang.evaluation import evaluate_texts, parse_metrics
from dplang.evaluation import registry as reg
from dplang.evaluation.registry import MetricContext, MetricOutput, MetricSpec, RunValue


@pytest.fixture
def isolated_registry(monkeypatch):
    """The built-ins, in a copy that the test may extend."""
    reg.metric_names()  # registers the built-ins
    monkeypatch.setattr(reg, "_METRICS", dict(reg._METRICS))
    monkeypatch.setattr(reg, "_ALIASES", dict(reg._ALIASES))


def _chars(ctx: MetricContext) -> MetricOutput:
    def stats(texts: list[str]) -> dict:
        lengths = np.array([len(t) for t in texts], dtype=np.float64)
        return {"mean": float(lengths.mean()), "max": int(lengths.max())}

    ctx.say("chars: counting")
    return MetricOutput([stats(run.texts) for run in ctx.runs], settings={"unit": "character"},
                        real=stats(ctx.real.texts))


TOY = MetricSpec(
    name="chars", compute=_chars, default=False, aliases=("characters",),
    aggregate=(RunValue("mean_chars", ("mean",), higher_is_better=None, header="chars",
                        real=()),),
    describe=lambda s: f"- chars: mean length in {(s or {})['unit']}s",
)


def _texts(tag: str, n: int = 24) -> list[str]:
    return [f"{tag} review {i}: the {'soup' if i % 2 else 'bread'} was fine" for i in range(n)]


def test_a_new_metric_is_one_registered_spec(tmp_path, isolated_registry) -> None:
    reg.register_metric(TOY)
    assert parse_metrics("characters,topk") == ("topk", "chars")
    assert parse_metrics(None) == ("mauve", "perplexity", "length", "topk")  # not a default
    assert reg.get_metric("chars").higher_is_better == {"mean_chars": None}
    result = evaluate_texts(_texts("real"), [_texts("a"), _texts("bb")], metrics="chars",
                            out_dir=tmp_path)
    assert result["settings"]["metrics"] == ["chars"]
    assert result["settings"]["chars"] == {"unit": "character"}
    assert result["real"]["chars"]["max"] == max(len(t) for t in _texts("real"))
    means = [r["chars"]["mean"] for r in result["runs"]]
    assert means[1] == pytest.approx(means[0] + 1)
    assert result["aggregate"]["mean_chars"]["mean"] == pytest.approx(np.mean(means))
    report = (tmp_path / "report.md").read_text()
    assert "- chars: mean length in characters" in report
    assert "| chars |" in report and "mean over 2 runs" in report
    assert (tmp_path / "metrics.png").exists() and not (tmp_path / "lengths.png").exists()


def test_registry_refuses_clashes(isolated_registry) -> None:
    reg.register_metric(TOY)
    with pytest.raises(ValueError, match="already registered"):
        reg.register_metric(TOY)
    with pytest.raises(ValueError, match="aggregate key"):
        reg.register_metric(MetricSpec(name="other", compute=_chars, aggregate=(
            RunValue("mauve", ("x",), higher_is_better=True, header="x"),)))
    with pytest.raises(ValueError, match="alias"):
        reg.register_metric(MetricSpec(name="third", compute=_chars, aliases=("ppl",),
                                       aggregate=()))
    with pytest.raises(ValueError, match="lower case"):
        reg.register_metric(MetricSpec(name="Upper", compute=_chars, aggregate=()))
    reg.register_metric(TOY, replace=True)


def test_builtin_specs_say_which_direction_is_better() -> None:
    assert reg.get_metric("mauve").higher_is_better == {"mauve": True}
    assert reg.get_metric("ppl").higher_is_better == {"delta_ppl": False, "ppl_synthetic": None}
    assert reg.get_metric("top-k").name == "topk"
    assert reg.metric_names()[:4] == ("mauve", "perplexity", "length", "topk")


def test_no_mean_over_runs_of_different_configurations(tmp_path, isolated_registry) -> None:
    """Issue 35 §6: runs made with other parameters or prompts are not seeds of one
    configuration: no 'mean over runs' then, and a warning says what differs."""
    import dplang
    from dplang.evaluation import evaluate_files
    from dplang.models import ToyModel

    reg.register_metric(TOY)
    real = tmp_path / "real.csv"
    real.write_text("text\n" + "".join(f"{t}\n" for t in _texts("real")))
    toy = ToyModel(vocab_size=30, eos_after=None)
    texts = _texts("ref", 48)
    runs = []
    for name, eps, seed in (("a", 3, 1), ("b", 3, 2), ("c", 5, 3)):
        dplang.generate(texts, epsilon=eps, dataset="refs", model=toy, batch_size=2,
                        max_tokens=4, seed=seed, describe="reviews", quiet=True,
                        out=tmp_path / f"{name}.jsonl")
        runs.append(tmp_path / f"{name}.jsonl")
    seeds = evaluate_files(real, runs[:2], metrics="chars", out_dir=tmp_path / "e1")
    assert "mean_chars" in seeds["aggregate"]
    mixed = evaluate_files(real, runs, metrics="chars", out_dir=tmp_path / "e2")
    assert mixed["aggregate"] == {}
    assert any("no mean over runs" in w and "parameters.clip" in w
               for w in mixed["warnings"]), mixed["warnings"]
