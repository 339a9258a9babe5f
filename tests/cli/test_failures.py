"""Every run that cannot start fails the same way: exit code 2, one line on stderr
(``error: ...``), no traceback, no new file and no ledger charge.

One row per case: the command and its arguments (built from a small world of files), and a
piece of the message the user must see: budgets that mean no privacy, bad data (missing,
empty, header-only, garbage or undecodable files, malformed JSONL), out-of-range B/T/ε/δ,
contradictory flags and a foreign --out.
Models are the toy model (``_load_model`` is replaced) except for the one row that needs a
real load to fail; ``_check_model`` (the pre-load check of ``--model``) is the real one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import dplang.cli.experiment as exp_cli
import dplang.cli.generate as gen_cli
import dplang.cli.report as report_cli
from dplang.cli.app import main
from dplang.models import ToyModel
from dplang.privacy.ledger import PrivacyLedger

World = dict[str, Path]


def _world(tmp: Path) -> World:
    w: World = {"tmp": tmp}
    rows = "\n".join(f"review number {i} was fine" for i in range(12))
    (tmp / "good.csv").write_text("text,stars\n" + "\n".join(
        f"review number {i} was fine,{i % 5 + 1}" for i in range(12)) + "\n")
    w["good"] = tmp / "good.csv"
    (tmp / "good.txt").write_text(rows + "\n")
    (tmp / "empty.csv").write_text("")
    (tmp / "header.csv").write_text("text\n")
    (tmp / "garbage.csv").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    (tmp / "badutf8.csv").write_bytes(b"text\nfine\n\xff\xfe broken\n")
    (tmp / "bad.jsonl").write_text('{"text": "a"}\n{"text": \n')
    (tmp / "quote.csv").write_text('text\nfine\n"never closed\nmore\nlast\n')
    # a stray quote that a later quote "closes" mid-field would merge two rows
    (tmp / "stray.csv").write_text("text,stars\n" + "".join(
        f"review number {i} was fine,{i % 5 + 1}\n" for i in range(10))
        + '"never closed,1\n"Great ""A"" rating",2\n' + "".join(
        f"review number {i} was fine,{i % 5 + 1}\n" for i in range(8)))
    (tmp / "inner.csv").write_text('text,stars\n"a "quoted" word",1\n' + "".join(
        f"review number {i} was fine,{i % 5 + 1}\n" for i in range(12)))
    (tmp / "st.txt").write_text("Reviews mention fine things\tfine\n")
    (tmp / "notsqlite.db").write_text("this is not a database\n")
    (tmp / "ledgerdir").mkdir()
    (tmp / "empty_model").mkdir()
    splits = tmp / "splits"  # a DatasetDict saved with save_to_disk: one folder per split
    (splits / "train").mkdir(parents=True)
    (splits / "train" / "state.json").write_text('{"_data_files": []}')
    (splits / "dataset_dict.json").write_text('{"splits": ["train"]}')
    w["splits"], w["ledgerdir"] = splits, tmp / "ledgerdir"
    (tmp / "fake.gguf").write_text("not a gguf file")
    incomplete = tmp / "incomplete_model"
    incomplete.mkdir()
    (incomplete / "config.json").write_text('{"model_type": "llama"}')
    broken = tmp / "broken_model"  # complete on paper; transformers cannot load it
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')
    (broken / "model.safetensors").write_bytes(b"\x00" * 16)
    (broken / "tokenizer.json").write_text("{}")
    (tmp / "taken.jsonl").write_text('{"group": 0, "text": "not ours"}\n')
    (tmp / "rep.json").write_text("{}\n")
    (tmp / "s.csv").write_text("stars\n1\n")
    (tmp / "evalfile").write_text("a file, not a folder\n")
    (tmp / "evaldone").mkdir()
    (tmp / "evaldone" / "metrics.json").write_text("{}\n")
    (tmp / "gen.jsonl").write_text("".join(
        json.dumps({"group": i, "text": f"text {i}", "num_tokens": 2, "token_ids": [1, 2]})
        + "\n" for i in range(4)))
    (tmp / "template.toml").write_text('private = "R: {reference}\\nA:"\npublic = "A:"\n')
    config = (
        'name = "t"\n[data]\npath = "good.csv"\nreferences = [0, 8]\nreal = [8, 12]\n'
        'prompt = "template.toml"\n[generation]\nmodel = "toy"\nmax_tokens = 3\nnum = 2\n'
        '[sweep]\nmethods = ["invisibleink"]\nepsilon = [1]\nbatch_size = [2]\ntop_k = [3]\n'
        '[evaluation]\nmetrics = ["topk"]\nembedder = "hashing"\n')
    (tmp / "exp.toml").write_text(config)
    (tmp / "exp_unknown.toml").write_text(config.replace("[generation]\n",
                                                         "[generation]\nfoo = 1\n"))
    (tmp / "exp_eps.toml").write_text(config.replace("epsilon = [1]", "epsilon = [1e308]"))
    (tmp / "exp_model.toml").write_text(config.replace('"toy"', f'"{tmp / "nothing"}"'))
    (tmp / "exp_data.toml").write_text(config.replace('"good.csv"', '"missing.csv"'))
    return w


def gen(w: World, *extra: str, data: str = "good", out: str = "out/x.jsonl") -> list[str]:
    return ["generate", "--data", str(w["tmp"] / data if "." in data else w[data]),
            "--out", str(w["tmp"] / out), "-B", "3", "-T", "4", "--seed", "1", *extra]


def eps(*extra: str) -> tuple[str, ...]:
    return ("--epsilon", "3", *extra)


def report(w: World, *extra: str, out: str = "rep2") -> list[str]:
    return ["report", "--data", str(w["good"]), "--statements", str(w["tmp"] / "st.txt"),
            "--threshold", "0.5", "--seed", "1", "--out", str(w["tmp"] / out), *extra]


def sample(w: World, *extra: str, out: str = "s2.csv") -> list[str]:
    return ["sample", "--data", str(w["good"]), "--columns", "stars", "--domain",
            "stars=1..5", "--seed", "1", "--out", str(w["tmp"] / out), *extra]


def evaluate(w: World, out: str) -> list[str]:
    return ["evaluate", "--real", str(w["good"]), "--synthetic", str(w["tmp"] / "gen.jsonl"),
            "--metrics", "topk", "--out", str(w["tmp"] / out)]


def experiment(w: World, config: str = "exp.toml", *extra: str) -> list[str]:
    return ["experiment", str(w["tmp"] / config), "--out", str(w["tmp"] / "expout"), *extra]


T = Callable[[World], list[str]]
CASES: list[tuple[str, T, str]] = [
    # -- budgets that mean no privacy
    ("generate --epsilon inf", lambda w: gen(w, "--epsilon", "inf"), "finite"),
    ("generate --epsilon 1e308", lambda w: gen(w, "--epsilon", "1e308"), "ε ≤ 100"),
    ("generate --rho 1e300", lambda w: gen(w, "--rho", "1e300"), "ε ≤ 100"),
    ("generate --clip 1e300", lambda w: gen(w, "--clip", "1e300"), "ε ≤ 100"),
    ("report --epsilon 1e308", lambda w: report(w, "--epsilon", "1e308"), "ε ≤ 100"),
    ("sample --epsilon 1e308", lambda w: sample(w, "--epsilon", "1e308"), "ε ≤ 100"),
    ("sample --epsilon inf", lambda w: sample(w, "--epsilon", "inf"), "finite"),
    ("account --rho 1e300", lambda w: ["account", "--rho", "1e300"], "ε ≤ 100"),
    ("account --clip 1e300", lambda w: ["account", "--clip", "1e300"], "ε ≤ 100"),
    # -- models that are not models
    ("--model empty folder", lambda w: gen(w, *eps("--model", str(w["tmp"] / "empty_model"))),
     "config.json"),
    ("--model fake .gguf", lambda w: gen(w, *eps("--model", str(w["tmp"] / "fake.gguf"))),
     "GGUF header"),
    ("--model a .csv", lambda w: gen(w, *eps("--model", str(w["good"]))), ".gguf"),
    ("--model incomplete HF folder",
     lambda w: gen(w, *eps("--model", str(w["tmp"] / "incomplete_model"))), "no weights"),
    ("--model unloadable HF folder",
     lambda w: gen(w, *eps("--model", str(w["tmp"] / "broken_model"))), "cannot load it"),
    ("--model missing", lambda w: gen(w, *eps("--model", str(w["tmp"] / "nope"))), "not found"),
    ("report --proposer-model missing",
     lambda w: ["report", "--data", str(w["good"]), "--task", "t", "--proposer-model",
                str(w["tmp"] / "nope"), "--threshold", "0.5", "--epsilon", "1", "--predicate",
                "embedding", "--out", str(w["tmp"] / "r9")], "--proposer-model"),
    # -- outputs and ledgers that cannot be used
    ("generate --out under a file", lambda w: gen(w, *eps(), out="good.csv/gen.jsonl"),
     "cannot be created"),
    ("generate --out not .jsonl", lambda w: gen(w, *eps(), out="x.txt"), ".jsonl"),
    ("--ledger not SQLite",
     lambda w: gen(w, *eps("--ledger", str(w["tmp"] / "notsqlite.db"))), "not an SQLite"),
    ("--ledger a directory",
     lambda w: gen(w, *eps("--ledger", str(w["tmp"] / "ledgerdir"))), "is a folder"),
    ("--ledger uncreatable",
     lambda w: gen(w, *eps("--ledger", str(w["good"] / "l.sqlite"))), "cannot be created"),
    ("report --out uncreatable", lambda w: report(w, "--epsilon", "1", out="good.csv/r"),
     "cannot be created"),
    ("report --out exists", lambda w: report(w, "--epsilon", "1", out="rep"),
     "already exists"),
    ("report --out an existing folder", lambda w: report(w, "--epsilon", "1", out="ledgerdir"),
     "is an existing folder"),
    ("report --ledger not SQLite",
     lambda w: report(w, "--epsilon", "1", "--ledger", str(w["tmp"] / "notsqlite.db")),
     "not an SQLite"),
    ("sample --out exists", lambda w: sample(w, "--epsilon", "1", out="s.csv"),
     "already exists"),
    ("sample --ledger a directory",
     lambda w: sample(w, "--epsilon", "1", "--ledger", str(w["tmp"] / "ledgerdir")),
     "is a folder"),
    ("evaluate --out an existing file", lambda w: evaluate(w, "evalfile"), "existing file"),
    ("evaluate --out with results", lambda w: evaluate(w, "evaldone"), "already exists"),
    ("ledger show: not SQLite",
     lambda w: ["ledger", "show", "--ledger", str(w["tmp"] / "notsqlite.db")],
     "not an SQLite"),
    ("ledger budget: a directory",
     lambda w: ["ledger", "budget", "x", "--epsilon", "1", "--delta", "1e-6", "--ledger",
                str(w["tmp"] / "ledgerdir")], "is a folder"),
    # -- experiment configs
    ("experiment unknown key", lambda w: experiment(w, "exp_unknown.toml"),
     "[generation].foo"),
    ("experiment ε 1e308", lambda w: experiment(w, "exp_eps.toml"), "ε ≤ 100"),
    ("experiment bad model", lambda w: experiment(w, "exp_model.toml"), "not found"),
    ("experiment data missing", lambda w: experiment(w, "exp_data.toml"), "looked in"),
    # -- data
    ("data missing", lambda w: gen(w, *eps(), data="missing.csv"), "not found"),
    ("data empty", lambda w: gen(w, *eps(), data="empty.csv"), "empty"),
    ("data header only", lambda w: gen(w, *eps(), data="header.csv"), "no data rows"),
    ("data garbage", lambda w: gen(w, *eps(), data="garbage.csv"), "UTF-8"),
    ("data bad UTF-8", lambda w: gen(w, *eps(), data="badutf8.csv"), "UTF-8"),
    ("data malformed JSONL", lambda w: gen(w, *eps(), data="bad.jsonl"), "invalid JSON"),
    ("data unbalanced quote", lambda w: gen(w, *eps(), data="quote.csv"), "unbalanced"),
    ("data stray quote", lambda w: gen(w, *eps(), data="stray.csv"),
     "line 13: malformed CSV quoting (in a quoted field opened on line 12)"),
    ("data quote inside a quoted field", lambda w: gen(w, *eps(), data="inner.csv"),
     "line 2: malformed CSV quoting"),
    ("report data stray quote",
     lambda w: [*report(w, "--epsilon", "1")[:2], str(w["tmp"] / "stray.csv"),
                *report(w, "--epsilon", "1")[3:]], "malformed CSV quoting"),
    ("sample data stray quote",
     lambda w: [*sample(w, "--epsilon", "1")[:2], str(w["tmp"] / "stray.csv"),
                *sample(w, "--epsilon", "1")[3:]], "malformed CSV quoting"),
    ("data a folder", lambda w: gen(w, *eps(), data="ledgerdir"), "not a data file"),
    ("data a DatasetDict folder", lambda w: gen(w, *eps(), data="splits"),
     "give one split's folder"),
    ("data unknown column", lambda w: gen(w, *eps("--text-column", "body")), "body"),
    ("data too few references", lambda w: gen(w, *eps("-B", "50")), "larger than"),
    ("yelp without labels", lambda w: gen(w, *eps("--prompt", "yelp")), "--prompt generic"),
    # -- parameters out of range or contradictory (already passed)
    ("B = 0", lambda w: gen(w, *eps("-B", "0")), "--batch-size"),
    ("T = 0", lambda w: gen(w, *eps("-T", "0")), "--max-tokens"),
    ("ε = 0", lambda w: gen(w, "--epsilon", "0"), "--epsilon"),
    ("δ = 2", lambda w: gen(w, *eps("--delta", "2")), "--delta"),
    ("τ = inf", lambda w: gen(w, *eps("--temperature", "inf")), "--temperature"),
    ("--epsilon and --rho", lambda w: gen(w, *eps("--rho", "1")), "exactly one"),
    ("--dtype float16", lambda w: gen(w, *eps("--dtype", "float16")), "--dtype"),
    ("add-remove adjacency",
     lambda w: gen(w, *eps("--method", "augpe", "--adjacency", "add-remove")), "--adjacency"),
    ("foreign --out", lambda w: gen(w, *eps(), out="taken.jsonl"), "without a manifest"),
    # -- names that are not UTF-8 (undecodable bytes of a command line): no ledger, JSON file
    # or terminal can hold them, and a run used to stop half-way with an encoding error
    ("data path not UTF-8", lambda w: gen(w, *eps(), data="bad\udcff.csv"), "not valid UTF-8"),
    ("dataset not UTF-8", lambda w: gen(w, *eps("--dataset", "r\udcff")), "not valid UTF-8"),
    ("experiment config a folder", lambda w: experiment(w, "ledgerdir"), "is a folder"),
]


@pytest.fixture
def toy(monkeypatch):
    model = ToyModel(vocab_size=30, eos_after=None)
    real_loader = gen_cli._load_model

    def load(spec, dtype="float32"):
        if spec.endswith("broken_model"):  # the one row that needs a real load to fail
            return real_loader(spec, dtype)
        return model

    monkeypatch.setattr(gen_cli, "_load_model", load)
    monkeypatch.setattr(report_cli, "_load_model", lambda spec: model)
    monkeypatch.setattr(exp_cli, "_load_model", lambda spec, dtype="float32": model)
    return model


def _without_prompt_warning(err: str) -> str:
    """stderr without the warning that the generic prompt has no description (issue 35: these
    runs use the bare generic prompt on purpose)."""
    return "".join(line for line in err.splitlines(keepends=True)
                   if not line.startswith("warning: the generic prompt"))


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _charges() -> int:
    ledger = PrivacyLedger()
    return sum(len(ledger.releases(name)) for name in ledger.datasets())


@pytest.mark.parametrize(("case", "build", "needle"), CASES, ids=[c[0] for c in CASES])
def test_a_run_that_cannot_start(tmp_path, capsys, toy, case, build, needle):
    world = _world(tmp_path)
    args = build(world)
    _charges()  # creates the (test) ledger before the baseline
    before, charges = _tree(tmp_path), _charges()
    code = main(args)
    out = capsys.readouterr()
    assert code == 2, (case, out.err)
    assert out.err.startswith("error: ") and out.err.count("\n") == 1, out.err
    assert "Traceback" not in out.err + out.out
    assert needle in out.err, out.err
    assert _tree(tmp_path) == before, sorted(_tree(tmp_path) ^ before)
    assert _charges() == charges


def test_a_different_run_in_out_is_refused_before_the_model_loads(tmp_path, capsys, toy,
                                                                   monkeypatch):
    world = _world(tmp_path)
    assert main(gen(world, *eps(), "-q")) == 0
    loads = []
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": loads.append(1))
    before, charges = _tree(tmp_path), _charges()
    code = main(gen(world, "--epsilon", "4", "-q"))
    err = capsys.readouterr().err
    assert code == 2 and "different run" in err and "epsilon: 3.0 → 4.0" in err, err
    assert "--overwrite" in err and _without_prompt_warning(err).count("\n") == 1
    assert not loads and _tree(tmp_path) == before and _charges() == charges


def test_overwrite_replaces_another_run_after_the_charge(tmp_path, capsys, toy):
    world = _world(tmp_path)
    out = tmp_path / "out" / "x.jsonl"
    assert main(gen(world, *eps(), "-q")) == 0
    first = out.read_text()
    assert main(gen(world, "--epsilon", "4", "--seed", "2", "-q", "--overwrite")) == 0
    assert out.read_text() != first
    manifest = json.loads(out.with_name("x.manifest.json").read_text())
    assert manifest["fingerprint"]["parameters"]["epsilon"] == 4.0
    assert json.loads((out.parent / ".dplang-private" / "x.private.json").read_text()
                      )["seed"] == 2
    assert not any(p.name.endswith(".lock") for p in out.parent.iterdir())
    # over budget: the refused run leaves the earlier one untouched
    ledger = PrivacyLedger()
    name = str(world["good"].resolve())
    ledger.set_budget(name, ledger.spent(name).epsilon_at(1e-6) + 0.1, 1e-6)
    kept = out.read_text()
    assert main(gen(world, "--epsilon", "5", "--seed", "3", "-q", "--overwrite")) == 3
    assert out.read_text() == kept
    capsys.readouterr()


def test_quiet_prints_nothing_and_the_unused_references_are_explained(tmp_path, capsys, toy):
    world = _world(tmp_path)
    assert main(gen(world, *eps(), "-q")) == 0
    out = capsys.readouterr()
    assert out.out == "" and _without_prompt_warning(out.err) == ""
    assert main(gen(world, *eps(), out="out/y.jsonl")) == 0
    err = capsys.readouterr().err
    # 12 rows, B = 3: all used; with B = 5, 2 are left and the reason is given
    assert "4 generations × B = 3 use 12 references: all 12 rows" in err
    # (another release of the dataset: another seed, a reused one is refused)
    assert main(gen(world, *eps("-B", "5", "--seed", "2"), out="out/z.jsonl")) == 0
    err = capsys.readouterr().err
    assert "2 left unused" in err and "last N mod B = 2 rows do not fill one" in err
    assert "ETA" in err and "tok/s" in err


def test_first_use_default_prompt_on_a_plain_text_column(tmp_path, capsys, toy):
    """`dplang generate --data my.csv --epsilon 3 --out out.jsonl` on a CSV with only
    a text column works with every default (the default prompt needs no label)."""
    data = tmp_path / "my.csv"
    data.write_text("text\n" + "\n".join(f"a short text number {i}" for i in range(20)) + "\n")
    out = tmp_path / "out.jsonl"
    code = main(["generate", "--data", str(data), "--epsilon", "3", "--out", str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    manifest = json.loads(tmp_path.joinpath("out.manifest.json").read_text())
    params = manifest["fingerprint"]["parameters"]
    assert params["prompt"] == "generic" and manifest["fingerprint"]["prompt"]["name"] == "generic"
    assert (params["batch_size"], params["max_tokens"], params["temperature"]) == (7, 64, 1.2)
    # the clip norm `account` prints for the same ε is the one generate used
    assert main(["account", "--epsilon", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["clip"] == pytest.approx(params["clip"])
    assert len(out.read_text().splitlines()) == 20 // 7
    os.remove(out)


def test_a_default_model_that_fails_its_checks_is_a_defect_not_unsupported(
        tmp_path, capsys, monkeypatch):
    """The embedded default model is built to load everywhere (issue 33): if a load-time check
    ever refuses it, the user is told it is a defect to report, not that the model is not
    supported; another model's refusal keeps naming what differs."""
    from dplang.models.errors import UnsupportedModelError

    world = _world(tmp_path)
    why = "rotary embedding R (full_attention): its cos differs ... by up to 0.5"

    def refuse(spec, dtype="float32"):
        raise UnsupportedModelError(why)

    monkeypatch.setattr(gen_cli, "_load_model", refuse)
    _charges()
    charges = _charges()
    assert main(gen(world, *eps("--model", "default"), "-q")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "defect of dplang" in err and why in err, err
    assert "please report" in err and "cannot load it" not in err
    assert _charges() == charges
    other = tmp_path / "empty_model"
    (other / "config.json").write_text("{}")
    (other / "model.safetensors").write_bytes(b"0")
    (other / "tokenizer.json").write_text("{}")
    assert main(gen(world, *eps("--model", str(other)), "-q")) == 2
    err = capsys.readouterr().err
    assert f"--model {other}: cannot load it (UnsupportedModelError: {why})" in err, err


def test_paths_given_to_main_as_path_objects_still_run(tmp_path, capsys):
    """``main`` takes ``os.PathLike`` arguments (the UTF-8 check must not refuse them)."""
    PrivacyLedger(tmp_path / "l.sqlite").set_budget("d", 1.0, 1e-6)
    code = main(["ledger", "show", "--ledger", tmp_path / "l.sqlite"])
    out = capsys.readouterr()
    assert code == 0 and "dataset d" in out.out, out.err


def test_version_and_help_answer_in_a_folder_whose_name_is_not_utf8(tmp_path, capsys,
                                                                   monkeypatch):
    bad = os.fsdecode(bytes(tmp_path) + b"/d\xff")
    os.makedirs(bad)
    monkeypatch.chdir(bad)
    assert main(["--version"]) == 0 and "dplang" in capsys.readouterr().out
    code = main(["ledger", "show"])
    assert code == 2 and "current folder" in capsys.readouterr().err
