"""The registries are the only source of names: a metric and a generation method registered by a
test (nothing else edited) run through ``dplang experiment`` like the built-in ones: the config
accepts them, the sweep generates with the method (its option set in ``[generation]``) and
evaluates with the metric, and ``results.csv`` carries the metric's column."""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import dplang.cli.experiment as exp_cli
from dplang.cli.app import main
from dplang.evaluation import registry as metric_registry
from dplang.evaluation.registry import MetricContext, MetricOutput, MetricSpec, RunValue
from dplang.models import ToyModel
from dplang.privacy.guarantees import Adjacency, Guarantee
from dplang.textgen.engine import GroupJob, StepPolicy
from dplang.textgen.methods import (
    MethodInputs,
    MethodOption,
    MethodSpec,
    get_method,
    register_method,
    unregister_method,
)
from dplang.textgen.methods.registry import positive

# ------------------------------------------------------------------- a toy generation method


@dataclass(frozen=True)
class _Params:
    """InvisibleInk calibrated from the toy's own ``clip`` option (whatever ε the cell asks
    for), released under the toy's name."""

    inner: Any

    @classmethod
    def calibrate(cls, inputs: MethodInputs, options: Mapping[str, Any]) -> _Params:
        by_clip = dataclasses.replace(inputs, epsilon=None, rho=None, clip=options["clip"])
        return cls(get_method("invisibleink").calibrate(by_clip, {}))

    @property
    def clip(self) -> float:
        return self.inner.clip

    def guarantee(self) -> Guarantee:
        return dataclasses.replace(self.inner.guarantee(), mechanism="toysweep")

    def policy_factory(self, vocab_size: int) -> Callable[[GroupJob], StepPolicy]:
        return self.inner.policy_factory(vocab_size)


METHOD = MethodSpec(
    name="toysweep", summary="toy: InvisibleInk calibrated from a clip option",
    adjacencies=(Adjacency.REPLACE_BY_NULL,), calibrate=_Params.calibrate,
    options=(MethodOption("clip", float, 1.0, "Clip norm C.", positive, in_sweeps=True),),
)

# --------------------------------------------------------------------------- a toy metric


def _chars(ctx: MetricContext) -> MetricOutput:
    def mean_length(texts: list[str]) -> dict[str, float]:
        return {"mean": float(np.mean([len(t) for t in texts]))}

    return MetricOutput([mean_length(run.texts) for run in ctx.runs],
                        settings={"unit": "character"}, real=mean_length(ctx.real.texts))


METRIC = MetricSpec(
    name="chars", compute=_chars, default=False,
    aggregate=(RunValue("mean_chars", ("mean",), higher_is_better=None, header="chars",
                        real=()),),
    describe=lambda s: f"- chars: mean length in {(s or {})['unit']}s",
)

CONFIG = """
name = "registered-names"
[data]
path = "data.csv"
references = [0, 40]
real = [40, 60]
prompt = "template.toml"
[generation]
model = "toy"
max_tokens = 5
num = 8
concurrent_groups = 4
toysweep_clip = 0.5
[sweep]
methods = ["toysweep", "invisibleink"]
epsilon = [2]
batch_size = [2]
top_k = [4]
temperature = [1.0]
[evaluation]
metrics = ["chars"]
embedder = "hashing"
"""


@pytest.fixture
def registered(monkeypatch):
    """The toy method and metric, registered in copies of the registries."""
    metric_registry.metric_names()  # the built-ins first
    monkeypatch.setattr(metric_registry, "_METRICS", dict(metric_registry._METRICS))
    monkeypatch.setattr(metric_registry, "_ALIASES", dict(metric_registry._ALIASES))
    metric_registry.register_metric(METRIC)
    register_method(METHOD)
    yield
    unregister_method(METHOD.name)


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    rows = ["text"] + [f"sentence {i} about food and {'service' if i % 3 else 'prices'}"
                       for i in range(80)]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "template.toml").write_text(
        'private = "Review: {reference}\\nAnother review:"\npublic = "Another review:"\n')
    (tmp_path / "exp.toml").write_text(CONFIG)
    model = ToyModel(vocab_size=30, eos_after=None)
    monkeypatch.setattr(exp_cli, "_load_model", lambda spec, dtype="float32": model)
    monkeypatch.setattr(exp_cli, "_check_model", lambda spec: None)  # "toy" is no model path
    return tmp_path


def test_a_registered_metric_and_method_run_through_dplang_experiment(registered, sweep,
                                                                      capsys):
    out = sweep / "out"
    assert main(["experiment", str(sweep / "exp.toml"), "--out", str(out)]) == 0, \
        capsys.readouterr().err
    with open(out / "results.csv") as fh:
        rows = {r["method"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"toysweep", "invisibleink"}
    for method, row in rows.items():
        assert float(row["mean_chars"]) > 0  # the metric's own column
        assert row["calls_per_token"] == "3"  # B + 1, the registry's default
        cell = out / "cells" / f"{method}_eps2_B2_k4_t1_r0"
        metrics = json.loads((cell / "eval" / "metrics.json").read_text())
        assert metrics["settings"]["metrics"] == ["chars"]
        assert metrics["real"]["chars"]["mean"] > 0
    toy = out / "cells" / "toysweep_eps2_B2_k4_t1_r0"
    manifest = json.loads((toy / "gen.manifest.json").read_text())
    assert manifest["guarantee"]["mechanism"] == "toysweep"
    assert manifest["fingerprint"]["parameters"]["method_options"] == {"clip": 0.5}
    # the cell records the option the config set, so a changed value is a different cell
    spec = json.loads((toy / "cell.private.json").read_text())
    assert spec["generation"]["toysweep"] == {"clip": 0.5}
    assert "toysweep" not in json.loads(
        (out / "cells" / "invisibleink_eps2_B2_k4_t1_r0" / "cell.private.json").read_text()
    )["generation"]
    # dplang evaluate takes the metric too, and prints its values (no summary of its own)
    capsys.readouterr()
    assert main(["evaluate", "--real", str(out / "data" / "real.jsonl"), "--synthetic",
                 str(toy / "gen.jsonl"), "--metrics", "chars", "--out", str(sweep / "ev")]) == 0
    assert "n=8  mean_chars=" in capsys.readouterr().out
    assert main(["evaluate", "--real", str(out / "data" / "real.jsonl"), "--synthetic",
                 str(toy / "gen.jsonl"), "--metrics", "chars", "--test-num", "3", "--out",
                 str(sweep / "ev2")]) == 2
    assert "--label-column and --test-num are for --metrics downstream" in \
        capsys.readouterr().err


def test_the_config_takes_the_names_from_the_registries(registered, sweep):
    from dplang.experiments import ConfigError, load_config

    config = load_config(sweep / "exp.toml")
    assert config.metrics == ("chars",)
    assert config.method_options == {"augpe": {"iterations": 3, "variations": 7},
                                     "toysweep": {"clip": 0.5}}
    text = (sweep / "exp.toml").read_text()
    for old, new, message in (
            ("toysweep_clip = 0.5", "toysweep_clip = -1", r"\[generation\].toysweep_clip must "
                                                          r"be finite and > 0, got -1.0"),
            ("toysweep_clip = 0.5", "toysweep_clip = true", "must be a number, got True"),
            ("toysweep_clip = 0.5", "toysweep_temp = 1", r"unknown key \[generation\]"
                                                         r".toysweep_temp"),
            ('metrics = ["chars"]', 'metrics = ["nochars"]', "chars")):
        (sweep / "exp.toml").write_text(text.replace(old, new))
        with pytest.raises(ConfigError, match=message):
            load_config(sweep / "exp.toml")


def test_without_registration_the_names_are_unknown(sweep):
    from dplang.experiments import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"unknown key \[generation\].toysweep_clip"):
        load_config(sweep / "exp.toml")
    (sweep / "exp.toml").write_text(CONFIG.replace("toysweep_clip = 0.5\n", ""))
    with pytest.raises(ConfigError, match="unknown method 'toysweep'"):
        load_config(sweep / "exp.toml")
