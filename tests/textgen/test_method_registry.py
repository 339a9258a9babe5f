"""The method registry: adding a fifth generation method is one module and one registration.

The toy method below is a complete method (mechanism, calibration, guarantee, an option):
the exponential mechanism over the clipped mean of the private logits on the whole
vocabulary, without Top-k+. Registering it is all it takes for ``dplang generate --method
toyem --toyem-clip 0.5`` to run through the CLI, the release pipeline and the ledger."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import dplang.cli.generate as gen_cli
from dplang.cli.app import main
from dplang.models import ToyModel
from dplang.privacy.guarantees import Adjacency, Guarantee
from dplang.privacy.mechanisms import exponential_mechanism
from dplang.textgen.engine import GroupJob, StepPolicy
from dplang.textgen.methods import (
    MethodOption,
    MethodSpec,
    get_method,
    method_names,
    register_method,
    unregister_method,
)
from dplang.textgen.methods.invisibleink import candidate_scores
from dplang.textgen.methods.registry import MethodInputs, positive


class _ToyPolicy:
    def __init__(self, clip: float, batch_size: int, temperature: float) -> None:
        self.clip, self.batch_size, self.temperature = clip, batch_size, temperature

    def candidates(self, public: torch.Tensor) -> None:
        return None

    def choose(self, public: torch.Tensor, private: torch.Tensor, ids: torch.Tensor | None,
               rng: np.random.Generator) -> int:
        scores = candidate_scores(private, public, self.clip, self.batch_size)
        return int(exponential_mechanism(scores, self.temperature, rng))

    def stats(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class _ToyParams:
    clip: float
    batch_size: int
    temperature: float
    max_tokens: int
    delta: float

    @classmethod
    def calibrate(cls, inputs: MethodInputs, options: Mapping[str, Any]) -> _ToyParams:
        return cls(options["clip"], inputs.batch_size, inputs.temperature, inputs.max_tokens,
                   inputs.delta)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        rho = self.max_tokens * (self.clip / self.batch_size) ** 2 / (2 * self.temperature**2)
        return Guarantee.zcdp("toyem", "reference", Adjacency.REPLACE_BY_NULL, rho, self.delta)

    def policy_factory(self, vocab_size: int) -> Callable[[GroupJob], StepPolicy]:
        return lambda _job: _ToyPolicy(self.clip, self.batch_size, self.temperature)


TOY = MethodSpec(
    name="toyem", summary="toy: exponential mechanism on the clipped mean, full vocabulary",
    adjacencies=(Adjacency.REPLACE_BY_NULL,), calibrate=_ToyParams.calibrate,
    options=(MethodOption("clip", float, 1.0, "Clip norm C.", positive),),
    budget_forms=("epsilon",),
)


@pytest.fixture
def toy_method():
    register_method(TOY)
    yield TOY
    unregister_method("toyem")


def test_builtins_are_registered_with_their_contracts() -> None:
    assert method_names()[:4] == ("invisibleink", "amin", "adapmixed", "augpe")
    assert get_method("invisibleink").budget_forms == ("epsilon", "rho", "clip")
    assert Adjacency.ZERO_OUT in get_method("amin").adjacencies
    assert get_method("augpe").run_population is not None
    with pytest.raises(ValueError, match="must be one of"):
        get_method("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_method(get_method("amin"))
    with pytest.raises(ValueError, match="has no option"):
        get_method("amin").resolve_options({"iterations": 3})
    with pytest.raises(ValueError, match="--amin-sigma must be finite and > 0"):
        get_method("amin").resolve_options({"sigma": -1.0})
    with pytest.raises(ValueError, match="--amin-private-tokens must be int"):
        get_method("amin").resolve_options({"private_tokens": 2.5})


def test_a_fifth_method_is_one_registration(tmp_path, capsys, monkeypatch, toy_method) -> None:
    model = ToyModel(vocab_size=20, eos_after=None)
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": model)
    assert main(["generate", "--help"]) == 0
    assert "--toyem-clip" in capsys.readouterr().out
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(f"review {i} was good" for i in range(6)) + "\n")
    out = tmp_path / "toy.jsonl"
    prompt = tmp_path / "t.toml"
    prompt.write_text('private = "Here: {reference}\\nAnother:"\npublic = "Another:"\n')
    args = ["generate", "--data", str(data), "--out", str(out), "--epsilon", "3", "-B", "3",
            "-T", "4", "--seed", "1", "--prompt", str(prompt), "--method", "toyem", "-q",
            "--ledger", str(tmp_path / "l.db")]
    assert main([*args, "--toyem-clip", "0.5"]) == 0, capsys.readouterr().err
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 2 and all(r["method"] == "toyem" for r in lines)
    manifest = json.loads(out.with_name("toy.manifest.json").read_text())
    guarantee = manifest["guarantee"]
    assert guarantee["mechanism"] == "toyem"
    assert guarantee["rho"] == pytest.approx(4 * (0.5 / 3) ** 2 / (2 * 1.2**2))
    assert manifest["fingerprint"]["parameters"]["method_options"] == {"clip": 0.5}
    # its option is checked by the spec, and another method's flag is refused
    assert main([*args, "--toyem-clip", "-1", "--overwrite"]) == 2
    assert "--toyem-clip must be finite and > 0" in capsys.readouterr().err
    assert main([*args, "--amin-sigma", "0.2", "--overwrite"]) == 2
    assert "--amin-sigma applies to --method amin only" in capsys.readouterr().err
