"""``report``, ``sample`` and ``formal run --data`` stopped inside or after their charge: the
message says what was charged and written, an ``--overwrite`` never leaves two releases' files
side by side, and ``formal run --data`` checks and locks its ``--out`` before the charge and
publishes its folder whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dplang.cli.app import main
from dplang.formal.release import data_lines
from dplang.privacy.ledger import PrivacyLedger
from dplang.release import Release


def _run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _stop_after_charge(monkeypatch, *, record: bool = True):
    """Ctrl-C inside the ledger's charge (after it recorded the release, or before)."""
    original = PrivacyLedger.charge

    def charge(self, *args, **kw):
        if record:
            original(self, *args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(PrivacyLedger, "charge", charge)


def _stop_at_write(monkeypatch, nth: int):
    """Ctrl-C at a release's ``nth`` public write (1-based; after the charge)."""
    calls = {"n": 0}
    originals = {name: getattr(Release, name) for name in ("write_output", "write_manifest")}

    def wrap(name):
        def write(self, *args, **kw):
            calls["n"] += 1
            if calls["n"] == nth:
                raise KeyboardInterrupt
            return originals[name](self, *args, **kw)
        return write

    for name in originals:
        monkeypatch.setattr(Release, name, wrap(name))


# --------------------------------------------------------------------------- sample


@pytest.fixture
def table(tmp_path):
    rows = ["color"] + [["red", "green", "blue"][i % 3] for i in range(30)]
    path = tmp_path / "d.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _sample(capsys, table, out, *extra):
    return _run(capsys, "sample", "--data", str(table), "--columns", "color", "--domain",
                "color=red,green,blue", "--epsilon", "1", "--out", str(out), *extra)


def test_sample_stopped_after_its_charge_says_so(tmp_path, capsys, monkeypatch, table):
    _stop_after_charge(monkeypatch)
    code, _, err = _sample(capsys, table, tmp_path / "s.csv")
    assert code == 130 and "the release is in the ledger of dataset" in err, err
    assert "nothing was written" in err and "charged again" in err


def test_sample_overwrite_stopped_midway_leaves_no_earlier_files(tmp_path, capsys,
                                                                 monkeypatch, table):
    out = tmp_path / "s.csv"
    assert _sample(capsys, table, out, "--num", "1")[0] == 0
    _stop_at_write(monkeypatch, 2)  # after the new manifest, before the samples
    code, _, err = _sample(capsys, table, out, "--num", "2", "--overwrite", "--seed", "4")
    assert code == 130 and "s.manifest.json but not all its files" in err, err
    assert "same --seed is the same release" in err
    assert not out.exists()  # the earlier release's samples are gone, not left beside it
    assert json.loads((tmp_path / "s.manifest.json").read_text())["parameters"]["num"] == 2


# --------------------------------------------------------------------------- report


def test_report_overwrite_stopped_midway_leaves_no_earlier_files(tmp_path, capsys,
                                                                 monkeypatch):
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(f"the food was great {i}" for i in range(20)) + "\n")
    statements = tmp_path / "s.txt"
    statements.write_text("Reviewers praise the food\tgreat\n")
    out = tmp_path / "rep"
    args = ["report", "--data", str(data), "--statements", str(statements), "--predicate",
            "keyword", "--threshold", "0.2", "--out", str(out)]
    assert _run(capsys, *args, "--epsilon", "4")[0] == 0
    _stop_at_write(monkeypatch, 2)  # after rep.json, before rep.md
    code, _, err = _run(capsys, *args, "--epsilon", "1", "--overwrite")
    assert code == 130 and "rep.json but not all its files" in err, err
    assert not (tmp_path / "rep.md").exists()  # never the earlier report's beside it
    assert json.loads((tmp_path / "rep.json").read_text())["guarantee"]["epsilon"] == 1


# --------------------------------------------------------------------------- formal


@pytest.fixture
def elements(tmp_path):
    path = tmp_path / "e.txt"
    path.write_text("\n".join(["0"] * 50 + ["1"] * 10) + "\n")
    return path


def _formal(capsys, data, out, *extra):
    return _run(capsys, "formal", "run", "prefix-count", "--instance", "remark-5.7",
                "--epsilon", "1", "--data", str(data), "--out", str(out), *extra)


def _charges(data):
    return PrivacyLedger().spent(str(data.resolve())).releases


def test_formal_out_that_cannot_be_made_is_refused_before_the_charge(tmp_path, capsys,
                                                                     elements):
    code, _, err = _formal(capsys, elements, elements / "sub")
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1, err
    assert _charges(elements) == 0


def test_formal_out_held_by_another_process_is_refused(tmp_path, capsys, elements):
    out = tmp_path / "res"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom dplang.release import RunLock\n"
         "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)",
         str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = _formal(capsys, elements, out)
        assert code == 2 and "another dplang process" in err, err
        assert _charges(elements) == 0
    finally:
        holder.kill()
        holder.wait()
    assert _formal(capsys, elements, out)[0] == 0
    # a second run into the same, now full, folder is refused (under the lock)
    code, _, err = _formal(capsys, elements, out)
    assert code == 2 and "already exists" in err and _charges(elements) == 1


def test_formal_folder_appears_whole(tmp_path, capsys, monkeypatch, elements):
    out = tmp_path / "res"
    _stop_at_write(monkeypatch, 2)  # after results.csv, before the manifest
    code, _, err = _formal(capsys, elements, out)
    assert code == 130 and "the release was charged" in err and "nothing was written" in err
    assert sorted(os.listdir(tmp_path)) == ["e.txt"]  # no --out, no staging folder left
    monkeypatch.undo()
    assert _formal(capsys, elements, out)[0] == 0
    assert sorted(os.listdir(out)) == [".dplang-private", "results.csv",
                                       "results.manifest.json"]
    manifest = json.loads((out / "results.manifest.json").read_text())
    assert abs(os.stat(out).st_mtime - manifest["created"]) < 1e-3
    assert oct(os.stat(out).st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_formal_stopped_inside_an_unrecorded_charge(tmp_path, capsys, monkeypatch, elements):
    _stop_after_charge(monkeypatch, record=False)
    code, _, err = _formal(capsys, elements, tmp_path / "res")
    assert code == 130 and "nothing was charged or written" in err, err


@pytest.mark.parametrize("separator", ["\r", "\x0c", "\x1c", "\u2028", "\x85"])
def test_formal_records_are_lines_split_at_newlines_only(separator):
    """One record holding a character str.splitlines splits at is one record: the public n
    of a neighbouring file is the same."""
    assert data_lines(f"1\n3{separator}4\n5\n") == ["1", f"3{separator}4", "5"]
    assert data_lines("\ufeff1\r\n2\r\n") == ["1", "2"]
    assert data_lines("1\n2") == ["1", "2"] and data_lines("") == []


def test_an_error_after_the_charge_says_it_was_charged(tmp_path, capsys, monkeypatch, table):
    """A full disk after the charge: exit 1 (not 2, "nothing charged or written"), and the
    message says what was charged."""
    import dplang.api.errors as api_errors
    import dplang.release as release_module

    assert api_errors.CHARGED_NOTE_PREFIX == release_module.CHARGED_NOTE_PREFIX

    def full_disk(self, *args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Release, "write_manifest", full_disk)
    code, _, err = _sample(capsys, table, tmp_path / "s.csv")
    assert code == 1 and "No space left" in err and "the release was charged" in err, err
    assert err.count("\n") == 1


def test_formal_error_after_the_charge_says_it_was_charged(tmp_path, capsys, monkeypatch,
                                                           elements):
    def full_disk(self, *args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Release, "write_output", full_disk)
    code, _, err = _formal(capsys, elements, tmp_path / "res")
    assert code == 1 and "the release was charged" in err and "No space left" in err, err
    assert sorted(os.listdir(tmp_path)) == ["e.txt"]


def test_formal_reads_naturals_of_any_length():
    from dplang.formal.release import _parse
    from dplang.formal.universe import Naturals

    big = "7" + "0" * 5000
    assert _parse(big, Naturals()) == 7 * 10 ** 5000
    assert _parse("42", Naturals()) == 42


def test_formal_a_lone_carriage_return_does_not_split_a_record(tmp_path):
    """Read as bytes: text mode would turn a lone "\\r" into a line break, two records."""
    from dplang.formal.release import FormalDataError, read_elements
    from dplang.formal.universe import Naturals

    path = tmp_path / "e.txt"
    path.write_bytes(b"1\r\n2\n3\r4\n")
    with pytest.raises(FormalDataError, match="line 3"):
        read_elements(path, Naturals())
    path.write_bytes(b"1\r\n2\n")
    assert read_elements(path, Naturals()) == [1, 2]


def test_formal_out_through_a_symbolic_link_to_an_empty_folder(tmp_path, capsys, elements):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    code, _, err = _formal(capsys, elements, tmp_path / "link")
    assert code == 0, err
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real" / "results.csv").exists()


def test_a_failure_inside_the_charge_is_not_reported_as_charged(tmp_path, capsys, monkeypatch,
                                                                table):
    from dplang.privacy.ledger import LedgerError

    assert _sample(capsys, table, tmp_path / "a.csv", "--seed", "9")[0] == 0

    def locked(self, *args, **kw):
        raise LedgerError("ledger l.sqlite: database is locked")

    monkeypatch.setattr(PrivacyLedger, "charge", locked)
    code, _, err = _sample(capsys, table, tmp_path / "b.csv", "--seed", "9")
    assert code == 2 and "database is locked" in err and "after the charge" not in err, err


def test_a_stop_before_the_charge_creates_no_ledger(tmp_path, capsys, monkeypatch, elements):
    def stop(self, on_warning=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(Release, "charge", stop)
    ledger = tmp_path / "new" / "l.sqlite"
    code, _, err = _formal(capsys, elements, tmp_path / "res", "--ledger", str(ledger))
    assert code == 130 and "nothing was charged or written" in err, err
    assert not ledger.exists()


def test_formal_value_error_after_the_charge_exits_1_and_says_so(tmp_path, capsys,
                                                                  monkeypatch, elements):
    import dplang.formal.release as formal_release

    def boom(*args, **kw):
        raise ValueError("boom")

    monkeypatch.setattr(formal_release, "_run", boom)
    code, _, err = _formal(capsys, elements, tmp_path / "res")
    assert code == 1 and "boom" in err and "after the charge: the release was charged" in err


def test_formal_a_stop_after_the_folder_is_published_says_it_is_complete(
        tmp_path, capsys, monkeypatch, elements):
    """A Ctrl-C after the folder was renamed into place (its last fsync) said "nothing was
    written"; the folder is whole, and the message says so."""
    import dplang.formal.release as formal_release

    def stop_at_the_fsync(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(formal_release, "fsync_dir", stop_at_the_fsync)
    out = tmp_path / "res"
    code, _, err = _formal(capsys, elements, out)
    assert code == 130 and "nothing was written" not in err, err
    assert "holds all its files" in err and (out / "results.manifest.json").exists()


def test_formal_a_staging_folder_left_by_a_killed_run_is_removed(tmp_path, capsys, elements):
    """A run killed outright (kill -9) left its hidden staging folder for ever; the next run
    into the same --out (under its lock) removes it, and never another --out's."""
    out = tmp_path / "res"
    dead = tmp_path / ".res.abcd_123.partial"
    other = tmp_path / ".res.b.abcd_123.partial"  # the staging folder of --out res.b
    for folder in (dead, other):
        folder.mkdir(mode=0o700)
        (folder / "results.csv").write_text("x\n")
    assert _formal(capsys, elements, out)[0] == 0
    assert not dead.exists() and other.exists()


def test_formal_an_empty_out_keeps_its_mode(tmp_path, capsys, elements):
    """A pre-created empty --out is replaced by the published folder: it keeps its mode."""
    out = tmp_path / "res"
    out.mkdir()
    os.chmod(out, 0o750)
    assert _formal(capsys, elements, out)[0] == 0
    assert oct(os.stat(out).st_mode & 0o7777) == oct(0o750)


def test_formal_out_through_a_link_is_locked_as_its_folder(tmp_path, capsys, elements):
    """A run into a symbolic link and one into the folder it names are one --out: the lock
    is the folder's (with the link's own lock, a second run removed the first one's staging
    folder as a dead one)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom dplang.release import RunLock\n"
         "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)",
         str(tmp_path / "real")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = _formal(capsys, elements, tmp_path / "link")
        assert code == 2 and "another dplang process" in err, err
        assert _charges(elements) == 0
    finally:
        holder.kill()
        holder.wait()


def test_formal_a_new_out_in_a_setgid_folder_keeps_the_bit(tmp_path, capsys, elements):
    """In a setgid folder a new folder inherits the bit (and the group), as mkdir's would."""
    shared = tmp_path / "team"
    shared.mkdir()
    os.chmod(shared, 0o2775)
    assert _formal(capsys, elements, shared / "res")[0] == 0
    made = os.stat(shared / "res")
    assert made.st_mode & 0o2000 and made.st_gid == os.stat(shared).st_gid


def test_a_ledger_path_that_is_not_utf8_is_refused_before_the_charge(tmp_path, capsys,
                                                                     monkeypatch, elements):
    """$DPLANG_LEDGER under a folder whose name is not UTF-8: the run was charged and then
    stopped, writing nothing, on the side file that records the ledger."""
    bad = os.fsdecode(bytes(tmp_path) + b"/l\xff")
    os.makedirs(bad)
    monkeypatch.setenv("DPLANG_LEDGER", os.path.join(bad, "l.sqlite"))
    code, _, err = _formal(capsys, elements, tmp_path / "res")
    assert code == 2 and "the ledger" in err and "not valid UTF-8" in err, err
    assert not os.path.exists(os.path.join(bad, "l.sqlite"))
    assert not (tmp_path / "res").exists()
