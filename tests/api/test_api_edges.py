"""The Python API at its edges: a library user's inputs (numpy numbers, chunked tables, odd
lists), the program's warning filters, and what a call killed inside leaves behind."""

from __future__ import annotations

import fcntl
import os
import tempfile
import warnings
from pathlib import Path

import pytest

import dplang
from dplang.api.data import IN_MEMORY_NAME
from dplang.api.params import pythonize
from dplang.models import ToyModel
from dplang.privacy.ledger import PrivacyLedger
from dplang.release import TEMPORARY_RUN_PREFIX, Release

TEXTS = [f"review number {i} was fine" for i in range(12)]


@pytest.fixture
def toy():
    return ToyModel(vocab_size=30, eos_after=None)


def _releases(dataset: str) -> list[dict]:
    ledger = PrivacyLedger()
    return ledger.releases(dataset) if dataset in ledger.datasets() else []


def test_warnings_as_errors_never_end_a_charged_run(toy, recwarn):
    """No usable reference is warned about after the charge; under ``-W error`` the warning
    is shown, not raised: the run publishes as its neighbour with one usable row does."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alone = dplang.generate([None] * 6, epsilon=3, dataset="nulls", model=toy,
                                batch_size=3, max_tokens=3)
        usable = dplang.generate(["usable"] + [None] * 5, epsilon=3, dataset="one-row",
                                 model=toy, batch_size=3, max_tokens=3)
    assert len(alone.texts) == len(usable.texts) == 2
    assert len(_releases("nulls")) == len(_releases("one-row")) == 1
    shown = [str(w.message) for w in recwarn.list]
    assert any("holds a usable reference" in m for m in shown), shown
    # the warning names the data as the caller knows it, not its temporary copy's path
    assert not any(tempfile.gettempdir() + "/dplang-" in m for m in shown), shown


def test_ignored_warnings_stay_ignored(toy, recwarn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dplang.generate([None] * 3, epsilon=3, dataset="quiet-nulls", model=toy,
                        batch_size=3, max_tokens=2)
    assert not [w for w in recwarn.list if "usable reference" in str(w.message)]


def test_a_temporary_output_does_not_store_its_seed(toy, monkeypatch):
    """A call without ``out=`` can never be resumed: its private side file (left behind if
    the process is killed) holds no seed; with ``out=`` the seed is kept to resume."""
    written = []
    original = Release.write_private

    def spy(self, paths, record):
        written.append(record)
        return original(self, paths, record)

    monkeypatch.setattr(Release, "write_private", spy)
    dplang.generate(TEXTS, epsilon=3, dataset="temp-seed", model=toy, batch_size=3,
                    max_tokens=2, quiet=True)
    out = Path(tempfile.mkdtemp()) / "kept.jsonl"
    dplang.generate(TEXTS, epsilon=3, dataset="kept-seed", model=toy, batch_size=3,
                    max_tokens=2, quiet=True, out=out)
    assert [r["seed"] is None for r in written] == [True, False]


def test_a_killed_calls_leftovers_are_removed_by_the_next_call(toy):
    """``kill -9`` runs no ``finally``: the data copy and the run folder it left stay until
    the next call, which removes those no live call holds, and keeps a live call's."""
    tmp = Path(tempfile.gettempdir())
    base = tmp / f"dplang-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    dead_data = base / ("0" * 32)
    dead_data.mkdir(mode=0o700)
    (dead_data / IN_MEMORY_NAME).write_bytes(b"private rows")
    (dead_data / ".users").touch()
    live_data = base / ("1" * 32)
    live_data.mkdir(mode=0o700)
    (live_data / ".users").touch()
    dead_run = Path(tempfile.mkdtemp(prefix=TEMPORARY_RUN_PREFIX))
    (dead_run / ".call").touch()
    (dead_run / "generations.jsonl").write_text("{}\n")
    live_run = Path(tempfile.mkdtemp(prefix=TEMPORARY_RUN_PREFIX))
    (live_run / ".call").touch()
    holds = [os.open(live_data / ".users", os.O_RDWR), os.open(live_run / ".call", os.O_RDONLY)]
    fcntl.flock(holds[0], fcntl.LOCK_SH)
    fcntl.flock(holds[1], fcntl.LOCK_EX)
    try:
        dplang.generate(TEXTS, epsilon=3, dataset="sweep", model=toy, batch_size=3,
                        max_tokens=2, quiet=True)
        assert not dead_data.exists() and not dead_run.exists()
        assert live_data.exists() and live_run.exists()
    finally:
        for fd in holds:
            os.close(fd)
        for folder in (live_data, live_run):
            for p in folder.iterdir():
                p.unlink()
            folder.rmdir()


def test_the_same_records_in_several_chunks_are_the_same_content(toy):
    pa = pytest.importorskip("pyarrow")
    whole = pa.table({"text": TEXTS})
    chunked = pa.concat_tables([pa.table({"text": TEXTS[:5]}), pa.table({"text": TEXTS[5:]})])
    first = dplang.generate(whole, epsilon=3, dataset="chunks", model=toy, batch_size=3,
                            max_tokens=3, quiet=True, seed=11)
    again = dplang.generate(chunked, epsilon=3, dataset="chunks", model=toy, batch_size=3,
                            max_tokens=3, quiet=True, seed=11)
    assert again.texts == first.texts and len(_releases("chunks")) == 1


def test_a_missing_integer_label_leaves_the_other_labels_as_they_are(toy):
    pd = pytest.importorskip("pandas")
    stars = [5, 2] * 5 + [None, 2]
    frame = pd.DataFrame({"text": TEXTS, "stars": stars})  # pandas: a float64 column
    result = dplang.generate(frame, group_by="stars", epsilon=3, dataset="stars", model=toy,
                             batch_size=1, max_tokens=2, quiet=True)
    assert {label["stars"] for label in result.labels} <= {"5", "2", ""}
    assert {"5", "2"} <= {label["stars"] for label in result.labels}


def test_numpy_numbers_are_taken_as_numbers(toy):
    np = pytest.importorskip("numpy")
    result = dplang.generate(TEXTS, epsilon=np.float32(3), seed=np.int64(5),
                             max_tokens=np.int32(2), dataset="numpy", model=toy,
                             batch_size=3, quiet=True)
    assert result.guarantee.epsilon == pytest.approx(3)
    assert len(result.texts) == 4
    with pytest.raises(dplang.DPLangError, match="must be"):
        dplang.generate(TEXTS, epsilon=3, seed=np.float64(2.5), dataset="numpy",
                        model=toy, quiet=True)


@pytest.mark.parametrize(("data", "needle"), [
    ("duplicate", "more than one column named 'text'"),
    (["fine", "\ud800"], "not valid Unicode"),
    ([{"text": 2 ** 70}], "cannot be read as a table"),
    ([{"text": "a"}, "b"], "data[1] is a str but data[0] is a record"),
])
def test_bad_data_is_one_clear_error_and_nothing_charged(toy, data, needle):
    if data == "duplicate":
        pa = pytest.importorskip("pyarrow")
        data = pa.table([pa.array(["a"]), pa.array(["b"])], names=["text", "text"])
    with pytest.raises(dplang.DPLangError) as refused:
        dplang.generate(data, epsilon=3, dataset="bad-data", model=toy, quiet=True)
    assert needle in str(refused.value)
    assert not _releases("bad-data")


@pytest.mark.parametrize(("item", "needle"), [
    (("Reviewers say\tthe soup is bad", "soup"), "holds a tab"),
    ("# not a comment", "starts with '#'"),
    ("", "has no text"),
    ("two\nstatements", "line break"),
    ("a\u2028b", "line break"),
])
def test_a_statement_that_would_read_back_as_another_is_refused(item, needle):
    with pytest.raises(dplang.DPLangError, match=needle):
        dplang.report(["the soup was great"] * 5, epsilon=1, threshold=0.3,
                      dataset="statements", statements=["Fine\tgreat", item], quiet=True)
    assert not _releases("statements")


def test_messages_name_keywords_and_only_dplangs_own_temporary_files():
    tmp = tempfile.gettempdir()
    assert pythonize("pass --num 3 or use --no-split") == "pass num 3 or use split=False"
    own = f"{tmp}/dplang-{os.getuid()}/{'ab' * 16}/{IN_MEMORY_NAME}"
    assert pythonize(f"{own}: row 3 is blank") == "data: row 3 is blank"
    theirs = f"{tmp}/dplang-myresults/gen.txt"
    assert pythonize(f"--out must end in .jsonl, got {theirs}") == (
        f"out must end in .jsonl, got {theirs}")
