import json
import os

import pytest

import dplang.cli.generate as gen_cli
from dplang.cli.app import main
from dplang.io import file_digest
from dplang.models import ToyModel
from dplang.privacy.ledger import PrivacyLedger
from dplang.release import TIMESTAMP_FIELDS

#: Private side files live in this folder beside the output (mode 700; dplang.release).
PRIVATE = ".dplang-private"


@pytest.fixture
def toy(monkeypatch):
    model = ToyModel(vocab_size=30, eos_after=None)
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": model)
    return model


def write_csv(path, n, blank_at=()):
    lines = ["text,label"]
    for i in range(n):
        lines.append(("" if i in blank_at else f"review number {i} was fine") + f",L{i % 2}")
    path.write_text("\n".join(lines) + "\n")
    return path


def run(capsys, *args):
    code = main(["generate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def base_args(data, out, *extra, quiet=True):
    template = custom_template(data.parent)
    return ["--data", str(data), "--out", str(out), "--epsilon", "10", "--batch-size", "3",
            "--max-tokens", "5", "--top-k", "4", "--seed", "1", "--prompt", str(template),
            *(["--quiet"] if quiet else []), *extra]


def custom_template(tmp_path):
    t = tmp_path / "t.toml"
    t.write_text('private = "Here: {reference}\\nAnother:"\npublic = "Another:"\n')
    return t


def test_generate_writes_records_and_manifest(tmp_path, capsys, toy):
    data = write_csv(tmp_path / "d.csv", 10, blank_at=(4,))
    out = tmp_path / "runs" / "x.jsonl"
    code, stdout, err = run(capsys, *base_args(data, out, "--prompt",
                                                str(custom_template(tmp_path)), quiet=False))
    assert code == 0, err
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["group"] for r in recs) == [0, 1, 2]  # ⌊10/3⌋
    ids = [i for r in recs for i in r["reference_ids"]]
    assert len(ids) == len(set(ids)) == 9 and sorted(ids) == list(range(9))
    for r in recs:
        assert set(r) >= {"group", "text", "num_tokens", "reference_ids", "topk_plus_mean",
                          "expansion_tokens"}
        assert r["num_tokens"] == 5
    manifest = json.loads((tmp_path / "runs" / "x.manifest.json").read_text())
    for key in ("rho", "epsilon", "delta", "clip", "adjacency"):
        assert key in manifest
    assert manifest["epsilon"] == pytest.approx(10)
    assert manifest["status"] == "complete"
    assert manifest["fingerprint"]["model_sha256"] == toy.weights_digest()
    assert manifest["fingerprint"]["model_dtype"] == "float32"
    assert manifest["fingerprint"]["parameters"]["dtype"] == "bfloat16"  # the default
    assert "seed" not in json.dumps(manifest["fingerprint"]["parameters"])
    # the public manifest holds nothing computed from the rows, nor paths
    text = json.dumps(manifest)
    assert file_digest(data) not in text and str(data) not in text
    assert "data" not in manifest and "ledger" not in manifest
    assert "unusable" not in text and "truncated_references" not in text
    # ... those live in the private side file, mode 600
    private_file = tmp_path / "runs" / PRIVATE / "x.private.json"
    assert oct(private_file.stat().st_mode & 0o777) == "0o600"
    private = json.loads(private_file.read_text())
    assert private["data"]["sha256"] == file_digest(data)
    assert private["data"]["read"]["unusable_by_reason"] == {"blank": 1}
    assert private["seed"] == 1 and private["dataset"] == str(data.resolve())
    assert PrivacyLedger().has_release(private["release_id"])
    assert "zCDP" in stdout


def test_resume_equals_uninterrupted(tmp_path, capsys, toy):
    data = write_csv(tmp_path / "d.csv", 15)
    t = str(custom_template(tmp_path))
    full = tmp_path / "full.jsonl"
    assert run(capsys, *base_args(data, full, "--prompt", t, "-G", "2"))[0] == 0
    part = tmp_path / "part.jsonl"
    assert run(capsys, *base_args(data, part, "--prompt", t, "-G", "2"))[0] == 0
    lines = part.read_text().splitlines(keepends=True)
    # simulate a kill after two finished generations and a torn third line
    part.write_text("".join(lines[:2]) + lines[2][:10])
    assert run(capsys, *base_args(data, part, "--prompt", t, "-G", "3"))[0] == 0

    def by_group(p):
        return {json.loads(x)["group"]: json.loads(x)["text"] for x in p.read_text().splitlines()}

    assert by_group(part) == by_group(full)
    # same parameters, data and seed: the same release, charged once (resume charges nothing)
    assert PrivacyLedger().spent(str(data.resolve())).releases == 1
    # a different run into the same file is refused
    code, _, err = run(capsys, *base_args(data, part, "--prompt", t, "--max-tokens", "7"))
    assert code == 2 and "different run" in err


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda a, tmp: a.__setitem__(1, str(tmp / "missing.csv")), "not found"),
        (lambda a, tmp: a.extend(["--text-column", "body"]), "body"),
        (lambda a, tmp: a.extend(["--num", "9"]), "9"),
        (lambda a, tmp: a.extend(["--temperature", "0"]), "--temperature"),
        (lambda a, tmp: a.extend(["--top-k", "-1"]), "--top-k"),
        (lambda a, tmp: a.extend(["--delta", "2"]), "--delta"),
        (lambda a, tmp: a.extend(["--clip", "1"]), "exactly one"),
        (lambda a, tmp: a.extend(["--prompt", "nonexistent-template"]), "template"),
        (lambda a, tmp: a.extend(["--prompt", "yelp"]), "group by"),  # needs label columns
        (lambda a, tmp: a.extend(["--dtype", "float16"]), "--dtype"),
    ],
)
def test_bad_input_writes_nothing(tmp_path, capsys, toy, mutate, needle):
    data = write_csv(tmp_path / "d.csv", 10)
    out = tmp_path / "o" / "x.jsonl"
    args = base_args(data, out)
    mutate(args, tmp_path)
    code, _, err = run(capsys, *args)
    assert code != 0
    assert err.startswith("error:") and err.count("\n") == 1 and needle in err
    assert not (tmp_path / "o").exists()


def test_undecodable_and_too_few_references(tmp_path, capsys, toy):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"text\nok\n\xff\xfe broken\n")
    code, _, err = run(capsys, *base_args(bad, tmp_path / "o.jsonl"))
    assert code == 2 and "utf-8" in err.lower()
    few = write_csv(tmp_path / "few.csv", 2)
    code, _, err = run(capsys, *base_args(few, tmp_path / "o.jsonl"))
    assert code == 2 and err.count("\n") == 1
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    code, _, err = run(capsys, *base_args(empty, tmp_path / "o.jsonl"))
    assert code == 2
    assert not os.path.exists(tmp_path / "o.jsonl")


def test_budget_refusal(tmp_path, capsys, toy, monkeypatch):
    data = write_csv(tmp_path / "d.csv", 6)
    ledger = tmp_path / "ledger.sqlite"
    PrivacyLedger(ledger).set_budget(str(data.resolve()), epsilon=12.0, delta=1e-6)
    t = str(custom_template(tmp_path))
    args = [*base_args(data, tmp_path / "a.jsonl", "--prompt", t, "--seed", "2"),
            "--ledger", str(ledger)]
    assert run(capsys, *args)[0] == 0
    code, _, err = run(capsys, *base_args(data, tmp_path / "b.jsonl", "--prompt", t),
                       "--ledger", str(ledger))
    assert code == 3 and "budget" in err
    assert not (tmp_path / "b.jsonl").exists()
    assert not (tmp_path / PRIVATE / "b.private.json").exists()
    assert not (tmp_path / "b.manifest.json").exists()


def _public(path):
    """A public JSON file with its wall-clock fields removed."""
    doc = json.loads(path.read_text())
    for key in TIMESTAMP_FIELDS:
        doc.pop(key, None)
    return json.dumps(doc, sort_keys=True)


def _without_released(doc):
    """A public manifest without the fields it lists as released DP statistics (outputs of
    the mechanism, covered by its guarantee, like the texts)."""
    doc = json.loads(json.dumps(doc))
    for dotted in doc.get("released_statistics", []):
        node = doc
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node[key]
        del node[leaf]
    return doc


@pytest.mark.parametrize("method", ["invisibleink", "augpe"])
def test_public_files_of_neighbouring_datasets_are_equal(tmp_path, capsys, toy, monkeypatch,
                                                         method):
    """Replace-by-null neighbours (one reference blanked): every public file but the released
    texts is byte-equal up to timestamps and the fields the manifest itself lists as released
    DP statistics (Aug-PE's noisy-count sums...); the differences are in the private side file
    only."""
    import dplang.textgen.methods.augpe as augpe_mod

    real_run = augpe_mod.run_augpe
    monkeypatch.setattr(augpe_mod, "run_augpe",
                        lambda *a, **kw: real_run(*a, **{**kw, "embedder": "hashing"}))
    t = str(custom_template(tmp_path))
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    data = write_csv(tmp_path / "x" / "d.csv", 11)
    neighbour = write_csv(tmp_path / "y" / "d.csv", 11, blank_at=(4,))
    extra = (["--augpe-iterations", "2", "--augpe-variations", "1"] if method == "augpe"
             else [])
    files = {}
    for d in (data, neighbour):
        out = d.parent / "out" / "gen.jsonl"
        code, _, err = run(capsys, *base_args(d, out, "--prompt", t, "--seed", "9",
                                              "--max-reference-tokens", "3",
                                              "--method", method, *extra))
        assert code == 0, err
        files[d] = sorted(p.name for p in out.parent.iterdir())
    assert files[data] == files[neighbour] == [PRIVATE, "gen.jsonl", "gen.manifest.json"]
    x, y = data.parent / "out", neighbour.parent / "out"
    mx, my = (json.loads(_public(p / "gen.manifest.json")) for p in (x, y))
    assert _without_released(mx) == _without_released(my)
    if method == "augpe":
        assert mx["released_statistics"] == my["released_statistics"]
        assert "augpe.noisy_count_sums" in mx["released_statistics"]
        assert "augpe.model_calls" not in mx["released_statistics"]  # public: compared
        assert mx["augpe"]["model_calls"] == my["augpe"]["model_calls"] > 0
    else:
        assert mx == my and "released_statistics" not in mx
    px, py = (json.loads((d / PRIVATE / "gen.private.json").read_text()) for d in (x, y))
    assert px != py
    assert px["data"]["read"]["unusable_by_reason"] == {}
    assert py["data"]["read"]["unusable_by_reason"] == {"blank": 1}
    if method == "invisibleink":
        assert px["data"]["truncated_references"] > py["data"]["truncated_references"]


def test_rerun_with_outputs_moved_away_is_a_new_charge(tmp_path, capsys, toy):
    data = write_csv(tmp_path / "d.csv", 6)
    t = str(custom_template(tmp_path))
    args = ["--data", str(data), "--out", str(tmp_path / "a.jsonl"), "--epsilon", "1",
            "--batch-size", "3", "--max-tokens", "5", "--prompt", t, "--quiet"]
    assert run(capsys, *args)[0] == 0  # no --seed: fresh OS entropy
    ledger = PrivacyLedger()
    name = str(data.resolve())
    first = json.loads((tmp_path / PRIVATE / "a.private.json").read_text())
    moved = tmp_path / "moved"
    moved.mkdir()
    for f in ("a.jsonl", "a.manifest.json", f"{PRIVATE}/a.private.json"):
        (tmp_path / f).rename(moved / f.split("/")[-1])
    assert run(capsys, *args)[0] == 0
    second = json.loads((tmp_path / PRIVATE / "a.private.json").read_text())
    assert second["seed"] != first["seed"] and second["release_id"] != first["release_id"]
    assert ledger.spent(name).releases == 2
    # over budget: the third run is refused before anything is written
    ledger.set_budget(name, ledger.spent(name).epsilon_at(1e-6) + 0.1, 1e-6)
    for f in ("a.jsonl", "a.manifest.json", f"{PRIVATE}/a.private.json"):
        (tmp_path / f).unlink()
    code, _, err = run(capsys, *args)
    assert code == 3 and "budget" in err
    assert not (tmp_path / "a.jsonl").exists()
    assert not (tmp_path / PRIVATE / "a.private.json").exists()
    assert ledger.spent(name).releases == 2


def test_stale_private_file_is_refused(tmp_path, capsys, toy):
    data = write_csv(tmp_path / "d.csv", 6)
    out = tmp_path / "a.jsonl"
    args = base_args(data, out)
    assert run(capsys, *args)[0] == 0
    out.unlink()
    (tmp_path / "a.manifest.json").unlink()
    private = (tmp_path / PRIVATE / "a.private.json").read_text()
    code, _, err = run(capsys, *args)
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1
    assert "a.private.json" in err and "outputs are gone" in err
    assert not out.exists() and (tmp_path / PRIVATE / "a.private.json").read_text() == private
    # a run whose side file is gone cannot be resumed either
    assert run(capsys, *args)[0] == 2
    (tmp_path / PRIVATE / "a.private.json").unlink()
    assert run(capsys, *args)[0] == 0
    (tmp_path / PRIVATE / "a.private.json").unlink()
    code, _, err = run(capsys, *args)
    assert code == 2 and "private side file" in err and err.count("\n") == 1


def test_same_seed_same_release_new_seed_new_charge(tmp_path, capsys, toy):
    data = write_csv(tmp_path / "d.csv", 6)
    for out, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        args = base_args(data, tmp_path / f"{out}.jsonl", "--seed", seed)
        assert run(capsys, *args)[0] == 0
    texts = {o: (tmp_path / f"{o}.jsonl").read_text() for o in "abc"}
    assert texts["a"] == texts["b"]  # the same release (identical output): charged once
    assert PrivacyLedger().spent(str(data.resolve())).releases == 2


def test_dataset_names_key_the_budget(tmp_path, capsys, toy):
    data = write_csv(tmp_path / "d.csv", 6)
    ledger = PrivacyLedger()
    ledger.set_budget("reviews", 15.0, 1e-6)
    args = base_args(data, tmp_path / "a.jsonl", "--dataset", "reviews")
    code, _, err = run(capsys, *args)
    assert code == 0 and "warning" not in err
    assert ledger.spent("reviews").releases == 1 and ledger.spent(str(data.resolve())).releases == 0
    # a re-encoded copy (other bytes, same records) under the same name shares the budget,
    # with a warning for the data holder that the name's content changed
    copy = tmp_path / "copy.csv"
    copy.write_text(data.read_text().replace("\n", "\r\n"))
    code, _, err = run(capsys, *base_args(copy, tmp_path / "b.jsonl", "--dataset", "reviews"))
    assert code == 3 and "budget" in err and "other content" in err
    # the same bytes under another name: charged there, with a warning naming the first
    same = tmp_path / "same.csv"
    same.write_bytes(data.read_bytes())
    code, _, err = run(capsys, *base_args(same, tmp_path / "c.jsonl"))
    assert code == 0 and "already charged as dataset 'reviews'" in err
    assert not any(file_digest(data) in p.read_text()
                   for p in tmp_path.glob("*.manifest.json"))


@pytest.mark.audits("adapmixed")
@pytest.mark.parametrize(
    ("method", "extra", "mechanism", "ex_ante"),
    [
        ("amin", ["--amin-private-tokens", "3"], "amin", True),
        ("adapmixed", [], "adapmixed", False),
    ],
)
def test_baselines_through_the_cli(tmp_path, capsys, toy, method, extra, mechanism, ex_ante):
    data = write_csv(tmp_path / "d.csv", 9)
    out = tmp_path / f"{method}.jsonl"
    code, stdout, err = run(capsys, *base_args(data, out, "--method", method, *extra,
                                               quiet=False))
    assert code == 0, err
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 3 and all(r["method"] == method for r in recs)
    manifest = json.loads(out.with_name(f"{method}.manifest.json").read_text())
    assert manifest["guarantee"]["mechanism"] == mechanism
    assert manifest["guarantee"]["ex_ante"] is ex_ante
    if method == "amin":
        assert all(r["private_tokens"] <= 3 for r in recs)
        assert f"C={manifest['clip']:.4g}, " in err  # the plan line states its clip norm
    else:
        assert "C=" not in err  # AdaPMixED has no clip norm: no "C=0" in the plan line
        # no exact per-record privacy cost in the output (it differs between neighbours)
        assert not any({"rdp_cost", "epsilon_spent"} & set(r) for r in recs)
        assert "DATA-DEPENDENT" in stdout and "does NOT satisfy differential privacy" in stdout
        assert "satisfies" not in stdout and "satisfies" not in manifest["guarantee_summary"]


def test_amin_infeasible_is_an_error_with_numbers(tmp_path, capsys, toy):
    data = write_csv(tmp_path / "d.csv", 9)
    code, _, err = run(capsys, *base_args(data, tmp_path / "a.jsonl", "--method", "amin",
                                          "--amin-convention", "paper", "--epsilon", "1"))
    assert code == 2 and "infeasible" in err and "rho_SVT" in err
    code, _, err = run(capsys, *base_args(data, tmp_path / "a.jsonl", "--method", "adapmixed",
                                          "--adjacency", "zero-out"))
    assert code == 2 and "--adjacency" in err


@pytest.mark.parametrize("method", ["adapmixed", "augpe"])
def test_add_remove_is_refused(tmp_path, capsys, toy, method):
    """A per-batch add-remove bound is not a dataset-level guarantee: removing a row shifts
    later references into other batches and changes the number of generations."""
    data = write_csv(tmp_path / "d.csv", 9)
    out = tmp_path / "x.jsonl"
    code, _, err = run(capsys, *base_args(data, out, "--method", method,
                                          "--adjacency", "add-remove"))
    assert code == 2 and "--adjacency" in err and "replace-by-null" in err
    assert not out.exists()


def test_augpe_through_the_cli(tmp_path, capsys, toy, monkeypatch):
    import dplang.textgen.methods.augpe as augpe_mod

    monkeypatch.setattr(augpe_mod, "EMBEDDER", "hashing")
    data = write_csv(tmp_path / "d.csv", 9)
    out = tmp_path / "pe.jsonl"
    code, _, err = run(capsys, *base_args(data, out, "--method", "augpe", "--augpe-iterations",
                                          "2", "--augpe-variations", "1", quiet=False))
    assert code == 0, err
    # no "C=0" in the plan line, no "ETA after the first group" on the bar
    assert "augpe: 3 generations" in err and "C=" not in err
    assert "ETA after the first group" not in err
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 3 and all(r["method"] == "augpe" for r in recs)
    manifest = json.loads(out.with_name("pe.manifest.json").read_text())
    g = manifest["guarantee"]
    assert g["mechanism"] == "augpe" and g["epsilon"] == pytest.approx(10, rel=1e-6)
    assert manifest["augpe"]["model_calls"] > 0


def test_augpe_loads_its_embedder_before_the_charge(tmp_path, capsys, toy, monkeypatch):
    """The charge is the last step before the first private computation: Aug-PE's embedder
    loads before it, so a Ctrl-C while it loads is not charged."""
    import dplang.textgen.methods.augpe as augpe_mod

    data = write_csv(tmp_path / "d.csv", 9)
    charged_at_load: list[int] = []

    def interrupted_load(_spec="default"):
        ledger = PrivacyLedger()
        charged_at_load.append(sum(len(ledger.releases(d)) for d in ledger.datasets()))
        raise KeyboardInterrupt

    monkeypatch.setattr(augpe_mod, "resolve_embedder", interrupted_load)
    out = tmp_path / "pe.jsonl"
    code, _, err = run(capsys, *base_args(data, out, "--method", "augpe"))
    assert code == 130 and charged_at_load == [0]
    assert "before the release was charged: nothing was charged" in err
    assert not out.exists() and PrivacyLedger().spent(str(data.resolve())).releases == 0


def test_threads_option_sets_the_models_thread_count(tmp_path, monkeypatch) -> None:
    """--threads N reaches the models (through $DPLANG_THREADS); a bad value is refused."""
    import os

    from dplang.cli.app import main
    from dplang.models.dtypes import available_cores

    monkeypatch.delenv("DPLANG_THREADS", raising=False)
    assert main(["generate", "--data", str(tmp_path / "missing.csv"), "--out",
                 str(tmp_path / "o.jsonl"), "--epsilon", "1", "--threads", "0"]) == 2
    monkeypatch.setenv("DPLANG_THREADS", "1")  # restored after the test
    main(["generate", "--data", str(tmp_path / "missing.csv"), "--out",
          str(tmp_path / "o.jsonl"), "--epsilon", "1", "--threads", "3"])
    assert os.environ["DPLANG_THREADS"] == "3" and available_cores() == 3


def test_public_files_show_the_start_time_and_appear_whole(tmp_path, capsys, monkeypatch):
    """Issue 34 §5: while the run computes, nothing public grows (the output is in the private
    folder); at the end it appears whole, in group order, and the output and manifest carry
    the release's start time as their modification time, not the end of a computation whose
    length depends on the references. The manifest's "started" is that same instant (a later
    reading would show how long the steps since the opening took: it once did, by 0.05 s
    under load)."""
    import time

    class Slow(ToyModel):
        def next_hidden(self, *args, **kw):
            time.sleep(0.05)  # a computation that takes a while
            assert not out.exists()  # nothing public is growing meanwhile
            return super().next_hidden(*args, **kw)

    model = Slow(vocab_size=30, eos_after=None)
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": model)
    from dplang.release import Release

    write_private = Release.write_private

    def slow_private(self, *args, **kw):  # a step between the opening and the start
        time.sleep(0.02)
        return write_private(self, *args, **kw)

    monkeypatch.setattr(Release, "write_private", slow_private)
    data = write_csv(tmp_path / "d.csv", 12)
    out = tmp_path / "o" / "x.jsonl"
    run(capsys, *base_args(data, out, "-G", "3"))
    manifest_path = out.with_name("x.manifest.json")
    started = json.loads(manifest_path.read_text())["started"]
    for path in (out, manifest_path):
        assert abs(path.stat().st_mtime - started) < 1e-3, (path, path.stat().st_mtime - started)
    groups = [json.loads(line)["group"] for line in out.read_text().splitlines()]
    assert groups == sorted(groups) and len(groups) == 4
    assert not (out.parent / ".dplang-private" / "x.jsonl.partial").exists()
    assert (out.stat().st_mode & 0o777) == (0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_interrupted_grouped_population_run_is_redone_whole(tmp_path, capsys, toy,
                                                               monkeypatch):
    """Aug-PE runs whole (one run per label group): a rerun after a Ctrl-C in its second group
    makes every text again with the same seed, never appending them to the first group's
    (the output once held groups 0, 0, 1, 1, 2, 3)."""
    import dplang.textgen.methods.augpe as augpe_mod

    real_run = augpe_mod.run_augpe
    calls = {"n": 0, "fail": True}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["fail"] and calls["n"] == 2:
            raise KeyboardInterrupt
        return real_run(*args, **{**kwargs, "embedder": "hashing"})

    monkeypatch.setattr(augpe_mod, "run_augpe", interrupted)
    data = write_csv(tmp_path / "d.csv", 12)
    out = tmp_path / "o" / "g.jsonl"
    args = base_args(data, out, "--method", "augpe", "--augpe-iterations", "2",
                     "--augpe-variations", "1", "--group-by", "label")
    code, _, err = run(capsys, *args)
    assert code == 130 and "runs whole" in err and not out.exists(), err
    calls["fail"] = False
    assert run(capsys, *args)[0] == 0
    groups = [json.loads(line)["group"] for line in out.read_text().splitlines()]
    assert groups == sorted(set(groups)) == [0, 1, 2, 3]
    manifest = json.loads(out.with_name("g.manifest.json").read_text())
    assert manifest["generations_written"] == 4 and manifest["status"] == "complete"
