"""``dplang.generate``: one call from texts in memory, a DataFrame, a Dataset or a
path to texts and a guarantee, under the command line's privacy rules."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

import dplang
import dplang.cli.generate as gen_cli
from dplang.cli.app import main
from dplang.models import ToyModel
from dplang.privacy.ledger import PrivacyLedger
from dplang.release import TIMESTAMP_FIELDS

TEXTS = [f"review number {i} was fine" for i in range(12)]


class Interrupting(ToyModel):
    """A toy model whose decoding is interrupted (Ctrl-C) at its ``after``-th step."""

    def __init__(self, after: int, **kw) -> None:
        super().__init__(**kw)
        self.after, self.calls = after, 0

    def next_hidden(self, *args, **kw):
        self.calls += 1
        if self.calls == self.after:
            raise KeyboardInterrupt
        return super().next_hidden(*args, **kw)


@pytest.fixture
def toy():
    return ToyModel(vocab_size=30, eos_after=None)


def _releases(dataset: str) -> list[dict]:
    return PrivacyLedger().releases(dataset) if dataset in PrivacyLedger().datasets() else []


def _in_memory_folders() -> list[Path]:
    base = Path(tempfile.gettempdir()) / f"dplang-{os.getuid()}"
    return list(base.iterdir()) if base.exists() else []


def test_texts_in_memory_in_one_call(toy, capsys):
    result = dplang.generate(TEXTS, epsilon=3, dataset="reviews", model=toy, batch_size=3,
                             max_tokens=4)
    assert len(result.texts) == 4 and all(isinstance(t, str) for t in result.texts)
    assert result.labels == [{}] * 4 and result.out is None
    assert result.guarantee.epsilon == pytest.approx(3) and result.guarantee.ex_ante
    assert result.manifest["guarantee"] == result.guarantee.to_dict()
    assert result.manifest["status"] == "complete"
    # charged once, under the name given; nothing else left behind
    [release] = _releases("reviews")
    assert release["guarantee"]["epsilon"] == pytest.approx(3)
    assert not _in_memory_folders()
    frame = result.to_pandas()
    assert list(frame.columns) == ["text", "num_tokens", "stopped", "group"]
    assert frame["text"].tolist() == result.texts
    err = capsys.readouterr().err
    assert "invisibleink: 4 generations" in err and "generations" in err


def test_in_memory_data_needs_a_dataset_name(toy):
    with pytest.raises(dplang.DPLangError, match="dataset= is required") as info:
        dplang.generate(TEXTS, epsilon=3, model=toy)
    assert info.value.code == 2
    with pytest.raises(dplang.DPLangError, match=r"data\[1\] is a int"):
        dplang.generate(["a", 1], epsilon=3, model=toy, dataset="x")
    with pytest.raises(dplang.DPLangError, match=r"not a builtins\.dict"):
        dplang.generate({"text": TEXTS}, epsilon=3, model=toy, dataset="x")


def test_out_writes_exactly_what_the_cli_writes(tmp_path, tiny_llama_dir, capsys):
    data = tmp_path / "reviews.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")
    cli_out = tmp_path / "cli" / "x.jsonl"
    assert main(["generate", "--data", str(data), "--out", str(cli_out), "--epsilon", "3",
                 "-B", "3", "-T", "4", "--seed", "11", "--model", str(tiny_llama_dir),
                 "-q"]) == 0, capsys.readouterr().err
    api_out = tmp_path / "api" / "x.jsonl"
    result = dplang.generate(str(data), epsilon=3, batch_size=3, max_tokens=4, seed=11,
                             out=api_out, model=tiny_llama_dir, quiet=True)
    assert api_out.read_bytes() == cli_out.read_bytes()
    assert result.out == api_out
    assert [json.loads(line)["text"] for line in api_out.read_text().splitlines()] == \
        result.texts

    def public(path):
        manifest = json.loads(path.with_name("x.manifest.json").read_text())
        return {k: v for k, v in manifest.items() if k not in TIMESTAMP_FIELDS}

    assert public(api_out) == public(cli_out)
    assert {k: v for k, v in result.manifest.items() if k not in TIMESTAMP_FIELDS} == \
        public(api_out)
    private_path = api_out.parent / ".dplang-private" / "x.private.json"
    assert oct(private_path.stat().st_mode & 0o777) == "0o600"
    private = json.loads(private_path.read_text())
    assert private["seed"] == 11 and private["dataset"] == str(data.resolve())
    # the same seed, data and parameters: the same release as the CLI's, charged once
    assert len(_releases(str(data.resolve()))) == 1


def test_a_dataframe_grouped_by_a_label(toy):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"body": [*TEXTS, None, "x"], "stars": ["1", "2"] * 7,
                          "unused": range(14)})
    result = dplang.generate(frame, text_column="body", group_by="stars", epsilon=3,
                             dataset="frame", model=toy, batch_size=3, max_tokens=3,
                             quiet=True, seed=3)
    assert result.labels == [{"stars": "1"}] * 2 + [{"stars": "2"}] * 2
    assert [r["group"] for r in result.records] == [0, 1, 2, 3]
    table = result.to_pandas()
    assert list(table.columns) == ["text", "stars", "num_tokens", "stopped", "group"]
    # the same rows again (another process, another order of calls): the same content, so
    # the same release under the same seed (charged once)
    again = dplang.generate(frame, text_column="body", group_by="stars", epsilon=3,
                            dataset="frame", model=toy, batch_size=3, max_tokens=3,
                            quiet=True, seed=3)
    assert again.texts == result.texts and len(_releases("frame")) == 1


def test_batch_order_decides_which_groups_num_keeps(toy):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"body": TEXTS[:12], "stars": ["1", "2"] * 6})
    kept = {order: dplang.generate(frame, text_column="body", group_by="stars", epsilon=3,
                                   dataset="frame-orders", model=toy, batch_size=3,
                                   max_tokens=2, num=2, quiet=True, batch_order=order).labels
            for order in ("grouped", "interleaved")}
    assert kept == {"grouped": [{"stars": "1"}] * 2,
                    "interleaved": [{"stars": "1"}, {"stars": "2"}]}


def test_a_huggingface_dataset(toy):
    datasets = pytest.importorskip("datasets", reason="the optional extra dplang[hf]")
    ds = datasets.Dataset.from_dict({"text": TEXTS})
    result = dplang.generate(datasets.Dataset.from_dict({"text": TEXTS[:6]}), epsilon=3,
                             dataset="hf", model=toy, batch_size=3, max_tokens=3, quiet=True,
                             seed=1)
    # the same records, seed and parameters under the same name: the same release (a seed
    # reused for another release of a dataset is refused; each release draws its own noise)
    same = dplang.generate(TEXTS[:6], epsilon=3, dataset="hf", model=toy, batch_size=3,
                           max_tokens=3, quiet=True, seed=1)
    assert result.texts == same.texts and len(result) == 2
    with pytest.raises(dplang.DPLangError, match="DatasetDict"):
        dplang.generate(datasets.DatasetDict({"train": ds}), epsilon=3, dataset="d",
                        model=toy)


def test_refusals_carry_the_cli_message_and_charge_nothing(tmp_path, toy, capsys,
                                                           monkeypatch):
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": toy)
    for flags, kwargs in [
        (["--epsilon", "3", "-B", "50"], {"epsilon": 3, "batch_size": 50}),
        (["--epsilon", "3", "--rho", "1"], {"epsilon": 3, "rho": 1}),
        (["--epsilon", "1e9"], {"epsilon": 1e9}),
        (["--epsilon", "3", "--text-column", "body"], {"epsilon": 3, "text_column": "body"}),
    ]:
        assert main(["generate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"),
                     *flags]) == 2
        from dplang.api.params import pythonize

        cli = pythonize(capsys.readouterr().err.removeprefix("error: ").strip())
        with pytest.raises(dplang.DPLangError) as info:
            dplang.generate(data, model=toy, quiet=True, **kwargs)
        assert str(info.value) == cli and info.value.code == 2
    assert not _releases(str(data.resolve()))
    with pytest.raises(dplang.DPLangError, match="unknown keyword 'sigmaa'; did you mean sigma"):
        dplang.generate(data, epsilon=3, model=toy, method="amin", sigmaa=1.0)


def test_over_budget_is_refused_before_anything_is_read_or_loaded(tmp_path, capsys,
                                                                  monkeypatch):
    """The budget is checked before the data is read or the model loaded (20-45 s), not
    after."""
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")
    PrivacyLedger().set_budget(str(data.resolve()), 2.0, 1e-6)
    loads: list[str] = []

    def load(spec, dtype="float32"):
        loads.append(spec)
        raise AssertionError("the model must not load")

    monkeypatch.setattr(gen_cli, "_load_model", load)
    import dplang.api.generation as core

    def no_plan(*_a, **_k):
        raise AssertionError("the data must not be read")

    monkeypatch.setattr(core, "plan_generation", no_plan)
    out = tmp_path / "o.jsonl"
    assert main(["generate", "--data", str(data), "--out", str(out), "--epsilon", "3"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: release refused") and "over its budget ε=2" in err
    with pytest.raises(dplang.DPLangError, match="over its budget") as info:
        dplang.generate(data, epsilon=3, quiet=True)
    assert info.value.code == 3 and info.value.budget_exceeded
    assert not loads and not out.exists() and not _releases(str(data.resolve()))


def test_ctrl_c_while_the_model_loads_charges_nothing(tmp_path, capsys, monkeypatch):
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")

    def load(spec, dtype="float32"):
        raise KeyboardInterrupt

    monkeypatch.setattr(gen_cli, "_load_model", load)
    out = tmp_path / "o.jsonl"
    assert main(["generate", "--data", str(data), "--out", str(out), "--epsilon", "3"]) == 130
    err = capsys.readouterr().err
    assert err.startswith("error: interrupted") and err.count("\n") == 1
    assert not _releases(str(data.resolve())) and not list(tmp_path.glob("o*"))


def test_ctrl_c_mid_run_says_what_was_kept_and_charged_and_resumes(tmp_path, capsys,
                                                                    monkeypatch):
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")
    full = dplang.generate(data, epsilon=3, batch_size=3, max_tokens=4, seed=5,
                           concurrent_groups=1, model=ToyModel(vocab_size=30, eos_after=None),
                           out=tmp_path / "full.jsonl", quiet=True)
    model = Interrupting(after=10, vocab_size=30, eos_after=None)  # in the third group
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": model)
    out = tmp_path / "part.jsonl"
    args = ["generate", "--data", str(data), "--out", str(out), "--epsilon", "3", "-B", "3",
            "-T", "4", "-G", "1", "-q"]
    assert main(args) == 130
    err = "".join(line for line in capsys.readouterr().err.splitlines(keepends=True)
                  if not line.startswith("warning: the generic prompt"))  # on purpose here
    assert err.startswith("error: interrupted: 2 of 4 generations are kept in") and \
        err.count("\n") == 1, err
    assert "the release was charged to dataset" in err and "ε=3" in err
    assert "run the same command again to resume" in err and "part.private.json" in err
    # the finished generations are kept in the private folder until the run is complete
    partial = out.parent / ".dplang-private" / "part.jsonl.partial"
    assert "part.jsonl.partial" in err and not out.exists()
    assert len(partial.read_text().splitlines()) == 2
    assert partial.stat().st_mode & 0o077 == 0
    model.after = 0  # no more interruptions: the rerun resumes, charged nothing new
    assert main(args) == 0
    capsys.readouterr()
    private = json.loads((out.parent / ".dplang-private" / "part.private.json").read_text())
    assert len(_releases(str(data.resolve()))) == 2  # the full run's and this one's
    # the resumed file is what one uninterrupted run with the same seed writes (the same
    # release: its noise is drawn from H(seed, release id); another ledger, or the seed would
    # be refused as reused)
    whole = tmp_path / "whole.jsonl"
    model.after, model.calls = 0, 0
    assert main(["generate", "--data", str(data), "--out", str(whole), "--epsilon", "3", "-B",
                 "3", "-T", "4", "-G", "1", "-q", "--seed", str(private["seed"]),
                 "--ledger", str(tmp_path / "another-ledger.sqlite")]) == 0
    assert out.read_text() == whole.read_text()
    assert len(full) == 4


def test_ctrl_c_in_the_api_raises_interrupted(toy):
    model = Interrupting(after=3, vocab_size=30, eos_after=None)
    with pytest.raises(dplang.Interrupted, match="not kept \\(no out=\\)") as info:
        dplang.generate(TEXTS, epsilon=3, dataset="ctrl-c", model=model, batch_size=3,
                        max_tokens=4, quiet=True)
    assert isinstance(info.value, KeyboardInterrupt)
    assert len(_releases("ctrl-c")) == 1 and not _in_memory_folders()


def test_quiet_prints_nothing(toy, capfd):
    dplang.generate(TEXTS, epsilon=3, dataset="q", model=toy, batch_size=3, max_tokens=2,
                    quiet=True)
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_the_model_loaders_bars_are_folded_into_the_status(tmp_path, monkeypatch, capsys):
    """transformers' "Loading weights" bar would appear on every run beside dplang's own
    status line: it is off while the model loads (and restored after)."""
    hf_logging = pytest.importorskip("transformers.utils.logging")
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")
    seen: list[bool] = []

    def load(spec, dtype="float32"):
        seen.append(hf_logging.is_progress_bar_enabled())
        return ToyModel(vocab_size=30, eos_after=None)

    monkeypatch.setattr(gen_cli, "_load_model", load)
    hf_logging.enable_progress_bar()
    assert main(["generate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"),
                 "--epsilon", "3", "-B", "3", "-T", "2"]) == 0
    assert seen == [False] and hf_logging.is_progress_bar_enabled()
    assert "Loading weights" not in capsys.readouterr().err


def test_a_loaded_model_runs_a_release_only_with_a_passed_check(tiny_llama_dir, monkeypatch):
    """Issue 34 §2: a model passed in must have passed the row-invariance check for its
    configuration as it is now; one loaded for scoring (check_invariance=False) is checked at
    the call, and refused with the command line's message when it fails; a duck-typed object
    that cannot show a check is refused. Nothing is charged either way."""
    from dplang.models import attention, decoder, resolve_model

    monkeypatch.setenv("DPLANG_CACHE_DIR", str(tiny_llama_dir.parent / "cache-api"))
    scoring = resolve_model(str(tiny_llama_dir), check_invariance=False)
    assert not scoring.row_invariance_checked()

    def leaky(q, *args, **kwargs):  # a row's result depends on how many rows share the call
        return attention.attend(q, *args, **kwargs) * (1 + 1e-6 * q.shape[0])

    from dplang.models import cpu_kernels

    monkeypatch.setattr(cpu_kernels, "_NUMBA", False)
    monkeypatch.setattr(decoder, "attend", leaky)
    with pytest.raises(dplang.DPLangError, match="differs from the same row decoded alone"
                       ) as info:
        dplang.generate(TEXTS, epsilon=3, dataset="unchecked", model=scoring, batch_size=3,
                        max_tokens=2, quiet=True)
    assert info.value.code == 2 and "\n" not in str(info.value)
    assert _releases("unchecked") == []
    monkeypatch.undo()  # (the refusal is on record in that cache: another one now)
    monkeypatch.setenv("DPLANG_CACHE_DIR", str(tiny_llama_dir.parent / "cache-api-2"))
    result = dplang.generate(TEXTS, epsilon=3, dataset="checked", model=scoring,
                             batch_size=3, max_tokens=2, quiet=True)
    assert scoring.row_invariance_checked() and len(result.texts) == 4

    class DuckTyped(ToyModel):
        def row_invariance_checked(self) -> bool:
            return False

    with pytest.raises(dplang.DPLangError, match="has not passed dplang's row-invariance"):
        dplang.generate(TEXTS, epsilon=3, dataset="duck", batch_size=3, max_tokens=2,
                        model=DuckTyped(vocab_size=30, eos_after=None), quiet=True)
    assert _releases("duck") == []


def test_ctrl_c_inside_the_charge_says_it_was_charged(tmp_path, capsys, monkeypatch):
    """A Ctrl-C right after the ledger recorded the release, before the run heard back: the
    message asks the ledger, never says "nothing was charged" of a recorded release."""
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")
    original = PrivacyLedger.charge

    def charge_then_interrupt(self, *args, **kw):
        original(self, *args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(PrivacyLedger, "charge", charge_then_interrupt)
    monkeypatch.setattr(gen_cli, "_load_model",
                        lambda spec, dtype="float32": ToyModel(vocab_size=30, eos_after=None))
    args = ["generate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--epsilon",
            "3", "-B", "3", "-T", "4", "-q"]
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "interrupted while the release was charged: it is in the ledger" in err, err
    assert "nothing was charged" not in err
    assert len(_releases(str(data.resolve()))) == 1


def test_ctrl_c_of_an_overwrite_says_to_resume_without_it(tmp_path, capsys, monkeypatch):
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")
    model = Interrupting(after=10, vocab_size=30, eos_after=None)
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": model)
    args = ["generate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--epsilon",
            "3", "-B", "3", "-T", "4", "-G", "1", "-q", "--overwrite"]
    assert main(args) == 130
    assert "run the same command again without --overwrite to resume" in \
        capsys.readouterr().err


class Terminating(ToyModel):
    """A toy model whose process is sent SIGTERM (a scheduler's stop) at its 10th step."""

    calls = 0

    def next_hidden(self, *args, **kw):
        import signal

        self.calls += 1
        if self.calls == 10:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().next_hidden(*args, **kw)


def test_sigterm_is_handled_as_a_ctrl_c(tmp_path, capsys, monkeypatch):
    """``timeout``, Slurm, systemd and ``docker stop`` send SIGTERM: the run says what was
    kept and charged, removes its lock and marks nothing as still running; the rerun resumes."""
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")
    model = Terminating(vocab_size=30, eos_after=None)
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": model)
    out = tmp_path / "o.jsonl"
    args = ["generate", "--data", str(data), "--out", str(out), "--epsilon", "3", "-B", "3",
            "-T", "4", "-G", "1", "-q"]
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "interrupted: 2 of 4 generations are kept" in err, err
    assert not (tmp_path / ".o.jsonl.lock").exists()
    model.calls = -1000
    assert main(args) == 0 and len(out.read_text().splitlines()) == 4


def test_rerunning_a_complete_run_leaves_its_published_files_as_they_are(tmp_path, capsys,
                                                                          monkeypatch):
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")
    monkeypatch.setattr(gen_cli, "_load_model",
                        lambda spec, dtype="float32": ToyModel(vocab_size=30, eos_after=None))
    out = tmp_path / "o.jsonl"
    args = ["generate", "--data", str(data), "--out", str(out), "--epsilon", "3", "-B", "3",
            "-T", "4", "-q"]
    assert main(args) == 0
    manifest = tmp_path / "o.manifest.json"
    before = [(p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes()) for p in (out, manifest)]
    assert main(args) == 0
    after = [(p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes()) for p in (out, manifest)]
    assert after == before
    assert len(_releases(str(data.resolve()))) == 1


def test_an_output_named_like_anothers_legacy_files_keeps_apart(tmp_path, monkeypatch):
    """``x.jsonl.jsonl``'s manifest and side file have the names an older dplang gave
    ``x.jsonl``'s: a run into ``x.jsonl`` neither adopts nor removes them."""
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")
    monkeypatch.setattr(gen_cli, "_load_model",
                        lambda spec, dtype="float32": ToyModel(vocab_size=30, eos_after=None))

    def run(out, *extra):
        return main(["generate", "--data", str(data), "--out", str(out), "--epsilon", "3",
                     "-B", "3", "-T", "4", "-q", *extra])

    other = tmp_path / "x.jsonl.jsonl"
    assert run(other) == 0
    files = {p: p.read_bytes() for p in (other, tmp_path / "x.jsonl.manifest.json",
                                         tmp_path / ".dplang-private" / "x.jsonl.private.json")}
    assert run(tmp_path / "x.jsonl", "-T", "3") == 0  # other parameters: no "different run"
    assert run(tmp_path / "x.jsonl") == 2  # an existing output of another run, as always
    assert {p: p.read_bytes() for p in files} == files
    assert (tmp_path / "x.manifest.json").exists()
    assert len(_releases(str(data.resolve()))) == 2


def test_a_run_resumes_whichever_way_its_data_path_is_written(tmp_path, monkeypatch):
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(TEXTS) + "\n")
    monkeypatch.setattr(gen_cli, "_load_model",
                        lambda spec, dtype="float32": ToyModel(vocab_size=30, eos_after=None))
    monkeypatch.chdir(tmp_path)
    args = ["--out", str(tmp_path / "o.jsonl"), "--epsilon", "3", "-B", "3", "-T", "4", "-q"]
    assert main(["generate", "--data", "d.csv", *args]) == 0
    assert main(["generate", "--data", str(data), *args]) == 0
    assert len(_releases(str(data.resolve()))) == 1
