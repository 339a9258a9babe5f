"""The release pipeline's building blocks: durable writes, private modes, release identity."""

import json
import os
from pathlib import Path

import pytest

from dplang.privacy import Guarantee
from dplang.privacy.ledger import BudgetExceeded, PrivacyLedger
from dplang.release import (
    PRIVATE_DIR,
    AppendLog,
    OutputPaths,
    Release,
    ReleaseError,
    dataset_name,
    make_release_id,
    write_atomic,
    write_json,
)

G = Guarantee("test", "record", "replace-one", None, 1.0, 0.0)


@pytest.fixture
def open_umask():
    """Run with umask 0, so a mode below 600 can only come from the code itself."""
    old = os.umask(0)
    yield
    os.umask(old)


def test_private_writes_are_mode_600_from_creation(tmp_path, open_umask, monkeypatch):
    modes = []
    real_open = os.open

    def spy(path, flags, mode=0o777, *args, **kwargs):
        fd = real_open(path, flags, mode, *args, **kwargs)
        if flags & os.O_CREAT:
            modes.append(os.fstat(fd).st_mode & 0o777)
        return fd

    monkeypatch.setattr(os, "open", spy)
    write_atomic(tmp_path / "secret.json", "{}", private=True)
    write_json(tmp_path / "public.json", {"a": 1})
    assert modes == [0o600, 0o666]  # the temporary private file never had wider rights
    assert oct((tmp_path / "secret.json").stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "public.json").stat().st_mode & 0o777) == "0o666"
    assert json.loads((tmp_path / "public.json").read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["public.json", "secret.json"]


def test_atomic_write_keeps_the_old_file_when_it_fails(tmp_path, monkeypatch):
    target = tmp_path / "f.txt"
    write_atomic(target, "old")

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_atomic(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_append_log_appends_whole_lines(tmp_path):
    path = tmp_path / "o.jsonl"
    with AppendLog(path) as log:
        log.write_line('{"a": 1}')
    with AppendLog(path) as log:
        log.write_line('{"a": 2}\n')
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n'


def test_dataset_name(tmp_path):
    assert dataset_name(tmp_path / "x" / ".." / "d.csv") == str((tmp_path / "d.csv").resolve())
    assert dataset_name(tmp_path / "d.csv", " reviews ") == "reviews"
    with pytest.raises(ReleaseError):
        dataset_name(tmp_path / "d.csv", "  ")


def test_release_id_covers_what_determines_the_output():
    base = make_release_id("c", {"k": 1}, "d", "h", 7)
    assert base == make_release_id("c", {"k": 1}, "d", "h", 7)
    others = [make_release_id("c", {"k": 1}, "d", "h", 8),
              make_release_id("c", {"k": 2}, "d", "h", 7),
              make_release_id("c", {"k": 1}, "e", "h", 7),
              make_release_id("c", {"k": 1}, "d", "g", 7),
              make_release_id("b", {"k": 1}, "d", "h", 7)]
    assert len({base, *others}) == 6


def test_release_charges_before_any_output_and_splits_metadata(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("text\nsecret row\n")
    ledger = tmp_path / "l.sqlite"
    r = Release.open("test", data=data, guarantee=G, fingerprint={"p": 1}, ledger=ledger)
    assert r.seed >= 0 and r.dataset == str(data.resolve())
    with pytest.raises(RuntimeError, match="charge"):
        r.write_output(tmp_path / "out.txt", "x")
    assert not (tmp_path / "out.txt").exists()
    charge = r.charge()
    assert charge.recorded and PrivacyLedger(ledger).has_release(r.release_id)
    assert not r.charge().recorded  # idempotent
    public = r.public_manifest(rows=1)
    private = r.private_record(keep_seed=False, counts={"blank": 0})
    text = json.dumps(public)
    assert r.data_digest not in text and str(data) not in text and r.release_id not in text
    assert private["data"]["sha256"] == r.data_digest and private["seed"] is None
    assert private["release_id"] == r.release_id and private["counts"] == {"blank": 0}
    assert r.private_record(keep_seed=True)["seed"] == r.seed
    # a fresh seed is a new release
    again = Release.open("test", data=data, guarantee=G, fingerprint={"p": 1}, ledger=ledger)
    assert again.release_id != r.release_id
    PrivacyLedger(ledger).set_budget(r.dataset, 1.5, 1e-6)
    with pytest.raises(BudgetExceeded):
        again.charge()


def test_public_timestamp_is_taken_before_the_private_computation(tmp_path, monkeypatch):
    """The manifest's ``created`` is the time the release was opened (before its computation on
    the private rows): a slow computation does not move it, so it publishes no duration."""
    import time as time_mod

    from dplang.release import TIMESTAMP_FIELDS

    data = tmp_path / "d.csv"
    data.write_text("text\na\n")
    release = Release.open("test", data=data, guarantee=G, fingerprint={}, seed=1,
                           ledger=tmp_path / "l.sqlite")
    release.charge()
    later = time_mod.time() + 1000.0
    monkeypatch.setattr(time_mod, "time", lambda: later)  # "the computation took 1000 s"
    manifest = release.public_manifest()
    assert manifest["created"] == release.opened < later
    assert "finished" not in TIMESTAMP_FIELDS


@pytest.mark.parametrize("output, manifest, private, lock", [
    ("runs/x.jsonl", "runs/x.manifest.json", "runs/.dplang-private/x.private.json",
     "runs/.x.jsonl.lock"),
    ("o/samples.csv", "o/samples.manifest.json", "o/.dplang-private/samples.private.json",
     "o/.samples.csv.lock"),
    ("r/report.json", "r/report.manifest.json", "r/.dplang-private/report.private.json",
     "r/.report.json.lock"),
    ("DIR/results.csv", "DIR/results.manifest.json", "DIR/.dplang-private/results.private.json",
     "DIR/.results.csv.lock"),
    ("eval.v2", "eval.manifest.json", ".dplang-private/eval.private.json", ".eval.v2.lock"),
])
def test_output_paths_name_every_file_after_the_output(output, manifest, private, lock):
    """One naming scheme: NAME.EXT → NAME.manifest.json, .dplang-private/NAME.private.json,
    .NAME.EXT.lock (the lock after the whole name, so a folder output has its own)."""
    paths = OutputPaths.of(output)
    assert (paths.output, paths.manifest, paths.private, paths.lock) == tuple(
        map(Path, (output, manifest, private, lock)))


def test_output_paths_read_and_replace_the_names_of_older_versions(tmp_path):
    """An older dplang's manifest (``s.csv.manifest.json``) and side files (named after the
    whole output, or beside the output) are found, count as existing, are moved in on
    resume and removed when the output is written anew."""
    paths = OutputPaths.of(tmp_path / "s.csv")
    assert paths.legacy_manifests == (tmp_path / "s.csv.manifest.json",)
    assert paths.legacy_privates == (tmp_path / PRIVATE_DIR / "s.csv.private.json",
                                     tmp_path / "s.private.json",
                                     tmp_path / "s.csv.private.json")
    assert paths.existing() == []
    assert paths.find_manifest() == paths.manifest and paths.find_private() == paths.private
    (tmp_path / "s.csv.manifest.json").write_text("{}")
    (tmp_path / "s.csv.private.json").write_text("{}")
    assert paths.find_manifest() == tmp_path / "s.csv.manifest.json"
    assert paths.find_private() == tmp_path / "s.csv.private.json"
    assert paths.existing() == [tmp_path / "s.csv.manifest.json", tmp_path / "s.csv.private.json"]
    paths.adopt_legacy_private()
    assert paths.private.read_text() == "{}" and not (tmp_path / "s.csv.private.json").exists()
    assert oct((tmp_path / PRIVATE_DIR).stat().st_mode & 0o777) == "0o700"
    paths.remove()
    assert paths.existing() == []
    # a generate output's names are the same under the old and the new scheme
    gen = OutputPaths.of(tmp_path / "x.jsonl")
    assert gen.manifest == tmp_path / "x.manifest.json"
    assert tmp_path / "x.private.json" in gen.legacy_privates


def test_release_writes_replace_the_files_of_older_versions(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("text\na\n")
    paths = OutputPaths.of(tmp_path / "out" / "s.csv")
    paths.output.parent.mkdir()
    for old in (*paths.legacy_manifests, *paths.legacy_privates[1:]):
        old.write_text("{}")
    r = Release.open("test", data=data, guarantee=G, fingerprint={}, ledger=tmp_path / "l")
    r.charge()
    r.write_private(paths, r.private_record(keep_seed=False))
    r.write_manifest(paths, r.public_manifest())
    assert paths.existing() == [paths.manifest, paths.private]
    assert oct(paths.private.stat().st_mode & 0o777) == "0o600"


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write(tmp_path):
    """``kill -9`` inside write_atomic leaves ``.NAME.PID.HEX.tmp`` in the (public) folder; the
    next write of that file removes those whose process is gone, never a live one's."""
    import subprocess
    import sys

    from dplang.release import write_atomic

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone = tmp_path / f".out.jsonl.{int(dead.stdout)}.0a1b2c3d.tmp"
    live = tmp_path / f".out.jsonl.{os.getppid()}.0a1b2c3d.tmp"
    other = tmp_path / f".other.jsonl.{int(dead.stdout)}.0a1b2c3d.tmp"
    for p in (gone, live, other):
        p.write_text("texts")
    write_atomic(tmp_path / "out.jsonl", "x\n")
    assert not gone.exists() and live.exists() and other.exists()
    assert (tmp_path / "out.jsonl").read_text() == "x\n"


def test_a_dataset_name_that_is_not_utf8_is_refused():
    """Undecodable bytes of a name (lone surrogates) cannot be stored in a ledger."""
    from dplang.release import ReleaseError, dataset_key

    with pytest.raises(ReleaseError, match="not valid UTF-8"):
        dataset_key("reviews\udcff")
    assert dataset_key(" réviews ") == "réviews"
