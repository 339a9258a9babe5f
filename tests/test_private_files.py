"""Private files are invisible to other users, sizes included.

A mode-600 file can still be ``stat``-ed by anyone who may search its folder, and its size
told neighbouring datasets apart (a side file's ``"unusable_by_reason": {"blank": 1}`` appears
only when a row is blank). So every private file dplang writes lives in a folder only its owner
can enter (mode 700): the ``.dplang-private`` folder beside an output, or an experiment's whole
folder. These tests run each command on two neighbouring datasets and compare what another user
sees with ``os.stat``: the entries of every folder they may search, with their sizes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import dplang.cli.experiment as exp_cli
import dplang.cli.generate as gen_cli
from dplang.cli.app import main
from dplang.models import ToyModel

#: The folder beside an output that holds its private files (dplang.release.PRIVATE_DIR).
PRIVATE_DIR = ".dplang-private"


def others_view(root: Path, released: tuple[str, ...] = ()) -> dict[str, tuple[str, int | None]]:
    """What another user learns under ``root`` (a folder they may search) with ``os.stat``:
    every entry of every folder they may search (mode o+x; names are guessable) with its kind
    and size. A folder without o+x hides everything below it. The sizes of ``released`` files
    (released content, public manifests: compared elsewhere) are left out."""
    view: dict[str, tuple[str, int | None]] = {}

    def walk(folder: Path) -> None:
        for entry in sorted(folder.iterdir()):
            st = entry.lstat()
            rel = entry.relative_to(root).as_posix()
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
            view[rel] = (kind, None if entry.name in released else st.st_size)
            if kind == "dir" and st.st_mode & stat.S_IXOTH:
                walk(entry)

    walk(root)
    return view


def private_files(root: Path) -> list[Path]:
    """The owner's mode-600 files under ``root``."""
    return [p for p in root.rglob("*") if p.is_file() and stat.S_IMODE(p.stat().st_mode) == 0o600]


def assert_hidden_from_others(x: Path, y: Path, released: tuple[str, ...]) -> None:
    """Neighbours look the same to another user, and no private file is visible to them."""
    vx, vy = others_view(x, released), others_view(y, released)
    assert vx == vy
    assert private_files(x) and private_files(y)  # the owner has them
    for root, view in ((x, vx), (y, vy)):
        visible = {root / rel for rel, (kind, _) in view.items() if kind == "file"}
        assert not visible & set(private_files(root)), sorted(visible & set(private_files(root)))


def csv_rows(path: Path, n: int, blank: int | None = None) -> Path:
    lines = ["text,label"]
    for i in range(n):
        text = "" if i == blank else f"review number {i} was {'fine' * (1 + i % 3)}"
        lines.append(f"{text},L{i % 2}")
    path.write_text("\n".join(lines) + "\n")
    return path


def neighbours(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    return tmp_path / "x", tmp_path / "y"


@pytest.fixture
def toy(monkeypatch):
    model = ToyModel(vocab_size=30, eos_after=None)
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": model)
    monkeypatch.setattr(exp_cli, "_load_model", lambda spec, dtype="float32": model)
    monkeypatch.setattr(exp_cli, "_check_model", lambda spec: None)
    return model


def template(folder: Path) -> Path:
    t = folder / "t.toml"
    t.write_text('private = "Here: {reference}\\nAnother:"\npublic = "Another:"\n')
    return t


def test_generate_side_file_is_hidden(tmp_path, capsys, toy):
    x, y = neighbours(tmp_path)
    for d, blank in ((x, None), (y, 4)):
        data = csv_rows(d / "d.csv", 11, blank)
        code = main(["generate", "--data", str(data), "--out", str(d / "runs" / "gen.jsonl"),
                     "--epsilon", "5", "--batch-size", "3", "--max-tokens", "4",
                     "--prompt", str(template(d)), "--quiet"])
        assert code == 0, capsys.readouterr().err
    assert_hidden_from_others(x / "runs", y / "runs", ("gen.jsonl", "gen.manifest.json"))
    side = x / "runs" / PRIVATE_DIR / "gen.private.json"
    assert stat.S_IMODE(side.stat().st_mode) == 0o600
    assert stat.S_IMODE(side.parent.stat().st_mode) == 0o700


def test_report_side_file_is_hidden(tmp_path, capsys):
    x, y = neighbours(tmp_path)
    for d, blank in ((x, None), (y, 0)):
        data = csv_rows(d / "d.csv", 60, blank)
        statements = d / "s.txt"
        statements.write_text("Fine reviews\tfine\nNumbered\tnumber\n")
        code = main(["report", "--data", str(data), "--statements", str(statements),
                     "--predicate", "keyword", "--epsilon", "2", "--threshold", "0.2",
                     "--out", str(d / "out" / "rep")])
        assert code == 0, capsys.readouterr().err
    assert_hidden_from_others(x / "out", y / "out", ("rep.json", "rep.md"))
    assert (x / "out" / PRIVATE_DIR / "rep.private.json").is_file()


def test_sample_side_file_is_hidden(tmp_path, capsys):
    x, y = neighbours(tmp_path)
    for d, odd in ((x, "red"), (y, "purple")):  # one cell outside its declared domain
        data = d / "c.csv"
        data.write_text("color\n" + odd + "\n" + "".join(f"{['red', 'blue'][i % 2]}\n"
                                                         for i in range(59)))
        code = main(["sample", "--data", str(data), "--columns", "color", "--domain",
                     "color=red,blue", "--epsilon", "1", "--num", "2",
                     "--out", str(d / "out" / "s.csv")])
        assert code == 0, capsys.readouterr().err
    assert_hidden_from_others(x / "out", y / "out", ("s.csv", "s.manifest.json"))
    assert (x / "out" / PRIVATE_DIR / "s.private.json").is_file()


def test_formal_side_file_is_hidden(tmp_path, capsys):
    x, y = neighbours(tmp_path)
    for d, value in ((x, 0), (y, 2**70)):
        data = d / "s.txt"
        data.write_text("\n".join(map(str, [value] + [0] * 40 + [1] * 5)) + "\n")
        code = main(["formal", "run", "prefix-count", "--instance", "remark-5.7", "--epsilon",
                     "1", "--data", str(data), "--out", str(d / "rel")])
        assert code == 0, capsys.readouterr().err
    assert_hidden_from_others(x / "rel", y / "rel", ("results.csv", "results.manifest.json"))
    assert (x / "rel" / PRIVATE_DIR / "results.private.json").is_file()


CONFIG = """
name = "hidden"
[data]
path = "data.csv"
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
top_k = [3]
temperature = [1.0]
public_baseline = false
[evaluation]
metrics = ["topk"]
embedder = "hashing"
"""


def test_experiment_folder_is_private(tmp_path, capsys, toy):
    x, y = neighbours(tmp_path)
    for d, blank in ((x, None), (y, 1)):
        csv_rows(d / "data.csv", 30, blank)
        template(d)
        (d / "exp.toml").write_text(CONFIG)
        assert main(["experiment", str(d / "exp.toml"), "--out", str(d / "exp"), "-q"]) == 0, \
            capsys.readouterr().err
    views = [others_view(d, ("data.csv", "exp.toml", "t.toml", "gen.jsonl",
                             "gen.manifest.json")) for d in (x, y)]
    assert views[0] == views[1] and "exp" in views[0]
    for d in (x, y):
        assert not [p for p in private_files(d / "exp")
                    if p.relative_to(d).as_posix() in views[0]]
    assert stat.S_IMODE((x / "exp").stat().st_mode) == 0o700
    # an experiment folder left by an older dplang (world-searchable) is made private
    os.chmod(x / "exp", 0o755)
    assert main(["experiment", str(x / "exp.toml"), "--out", str(x / "exp"), "-q"]) == 0
    assert stat.S_IMODE((x / "exp").stat().st_mode) == 0o700


def test_a_run_of_an_older_dplang_resumes_and_its_side_file_moves_in(tmp_path, capsys, toy):
    """A side file left beside its output by an older dplang is still found (resume,
    evaluation), and a resumed run moves it into the private folder."""
    data = csv_rows(tmp_path / "d.csv", 12)
    out = tmp_path / "runs" / "gen.jsonl"
    args = ["generate", "--data", str(data), "--out", str(out), "--epsilon", "5",
            "--batch-size", "3", "--max-tokens", "4", "--prompt", str(template(tmp_path)),
            "--quiet"]
    assert main(args) == 0
    whole = out.read_text()
    side = tmp_path / "runs" / PRIVATE_DIR / "gen.private.json"
    legacy = tmp_path / "runs" / "gen.private.json"
    side.rename(legacy)
    out.write_text("".join(whole.splitlines(keepends=True)[:2]))  # interrupted after 2 groups
    assert main(args) == 0, capsys.readouterr().err
    assert out.read_text() == whole  # resumed with the stored seed: the same output
    assert side.is_file() and not legacy.exists()
    assert stat.S_IMODE(side.stat().st_mode) == 0o600

