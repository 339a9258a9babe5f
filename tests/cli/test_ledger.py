"""``dplang ledger show`` and ``dplang ledger budget``, against an SQLite file and a PostgreSQL
database (``$DPLANG_LEDGER`` or ``--ledger`` a URL)."""

import json

import pytest

import dplang.cli.generate as gen_cli
from dplang.cli.app import main
from dplang.models import ToyModel
from dplang.privacy import Guarantee, rho_to_epsilon
from dplang.privacy.ledger import PrivacyLedger
from dplang.privacy.ledger_backends import mask_url


@pytest.fixture
def default_ledger(new_ledger, monkeypatch):
    """``$DPLANG_LEDGER``: a fresh SQLite file, or a fresh PostgreSQL database's URL."""
    location = str(new_ledger())
    monkeypatch.setenv("DPLANG_LEDGER", location)
    return location


def run(capsys, *args):
    code = main(["ledger", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _g(rho):
    return Guarantee("invisibleink", "reference", "replace-by-null", rho,
                     rho_to_epsilon(rho, 1e-6), 1e-6)


def test_a_file_named_by_its_resolved_path_gets_no_warning(tmp_path, capsys, default_ledger,
                                                           monkeypatch):
    """A NAME that is a file here is warned about only when the file's releases are charged
    under another name (its resolved path); the resolved path itself is that name."""
    data = tmp_path / "d.csv"
    data.write_text("text\na\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "budget", str(data.resolve()), "--epsilon", "1", "--delta", "1e-6")
    assert code == 0 and "also a file here" not in err, err
    code, _, err = run(capsys, "budget", "d.csv", "--epsilon", "1", "--delta", "1e-6")
    assert code == 0 and "also a file here" in err and str(data.resolve()) in err, err


def test_budget_and_show(tmp_path, capsys, default_ledger):
    data = tmp_path / "d.csv"
    data.write_text("text\na\n")
    code, out, err = run(capsys, "budget", "--data", str(data), "--epsilon", "10",
                         "--delta", "1e-6")
    assert code == 0, err
    name = str(data.resolve())  # a data file is named as --dataset's default names it
    ledger = PrivacyLedger()
    assert ledger.budget(name) == (10.0, 1e-6) and name in out
    ledger.charge(name, "gen-1", _g(0.1), "dplang generate → a.jsonl", data_digest="h1")
    ledger.charge(name, "rep-1", Guarantee("report", "record", "replace-one", None, 1.0, 0.0),
                  "dplang report → r", data_digest="h1")
    ledger.charge("research", "ada-1",
                  Guarantee("adapmixed", "reference", "add-remove", None, 3.0, 1e-6,
                            ex_ante=False), "dplang generate (adapmixed) → b.jsonl")
    code, out, _ = run(capsys, "show")
    assert code == 0
    assert f"dataset {name}" in out and "dataset research" in out
    # a replace-by-null generation and a replace-one report: the total is stated under
    # replace-one, the generation counted at group distance 2 (4ρ)
    total = rho_to_epsilon(0.4, 1e-6) + 1.0
    assert f"ε = {total:.6g}" in out and "ρ = 0.4" in out
    assert "under replace-one adjacency" in out
    assert "mixed (1 replace-by-null, 1 replace-one)" in out
    assert "under replace-by-null adjacency" not in out
    assert f"remaining ε = {10 - total:.6g}" in out
    assert "dplang generate → a.jsonl" in out and "dplang report → r" in out
    assert "NOT differential privacy" in out and "DATA-DEPENDENT (not DP)" in out
    assert "h1" not in out  # no content digest is printed
    code, out, _ = run(capsys, "show", "research", "--json")
    doc = json.loads(out)["datasets"][0]
    assert doc["dp"]["releases"] == 0 and doc["dp"]["total_epsilon"] == 0
    assert doc["data_dependent"]["releases"] == 1
    assert doc["releases"][0]["ex_ante"] is False
    code, out, _ = run(capsys, "show", "--data", str(data), "--json")
    doc = json.loads(out)["datasets"][0]
    assert doc["dp"]["total_epsilon"] == pytest.approx(total)
    assert doc["dp"]["adjacency"] == "replace-one"
    assert doc["dp"]["converted_by_group_privacy"] == 1
    assert [r["adjacency"] for r in doc["releases"]] == ["replace-by-null", "replace-one"]
    assert doc["remaining_epsilon"] == pytest.approx(10 - total)
    # a budget below what is spent is refused; unknown datasets and bad values too
    code, _, err = run(capsys, "budget", name, "--epsilon", "1", "--delta", "1e-6")
    assert code == 2 and err.startswith("error:") and "already spent" in err
    assert run(capsys, "show", "nope")[0] == 2
    assert run(capsys, "budget", "x", "--epsilon", "0", "--delta", "1e-6")[0] == 2
    assert run(capsys, "budget", "x", "--epsilon", "1", "--delta", "1")[0] == 2


def test_data_dependent_generation_is_shown_apart_and_refused_under_a_budget(
        tmp_path, capsys, monkeypatch, default_ledger):
    monkeypatch.setattr(gen_cli, "_load_model",
                        lambda spec, dtype="float32": ToyModel(vocab_size=30, eos_after=None))
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "".join(f"review {i}\n" for i in range(6)))
    t = tmp_path / "t.toml"
    t.write_text('private = "Here: {reference}\\nAnother:"\npublic = "Another:"\n')

    def generate(out, *extra):
        code = main(["generate", "--data", str(data), "--out", str(tmp_path / out),
                     "--epsilon", "2", "--batch-size", "3", "--max-tokens", "3", "--prompt",
                     str(t), "--quiet", *extra])
        return code, capsys.readouterr().err

    assert generate("ink.jsonl", "--dataset", "reviews")[0] == 0
    assert generate("ada.jsonl", "--dataset", "reviews", "--method", "adapmixed")[0] == 0
    code, out, _ = run(capsys, "show", "reviews", "--json")
    doc = json.loads(out)["datasets"][0]
    assert doc["dp"]["releases"] == 1 and doc["data_dependent"]["releases"] == 1
    assert doc["dp"]["total_epsilon"] == pytest.approx(2.0, rel=1e-6)  # AdaPMixED not summed
    code, _, err = run(capsys, "budget", "reviews", "--epsilon", "10", "--delta", "1e-6")
    assert code == 0 and "data-dependent release(s), which no DP budget covers" in err
    code, err = generate("ada2.jsonl", "--dataset", "reviews", "--method", "adapmixed",
                         "--seed", "5")
    assert code == 3 and "data-dependent" in err
    assert not (tmp_path / "ada2.jsonl").exists()


def test_a_dataset_name_is_a_name_even_where_a_file_of_that_name_exists(
        tmp_path, capsys, monkeypatch, default_ledger):
    """`--dataset reviews` keys the budget "reviews" whether or not a file ./reviews exists:
    a name is never re-keyed to a path (which would give the data a fresh budget). `ledger
    budget NAME` is a name too; `ledger budget --data FILE` budgets the key a release of FILE
    without --dataset is charged to (its resolved path), and a charge to another name while
    that budget exists is warned about."""
    monkeypatch.setattr(gen_cli, "_load_model",
                        lambda spec, dtype="float32": ToyModel(vocab_size=30, eos_after=None))
    monkeypatch.chdir(tmp_path)
    rows = "text\n" + "".join(f"review {i}\n" for i in range(6))
    (tmp_path / "d.csv").write_text(rows)
    t = tmp_path / "t.toml"
    t.write_text('private = "Here: {reference}\\nAnother:"\npublic = "Another:"\n')

    def generate(out, *extra):
        code = main(["generate", "--data", "d.csv", "--out", out, "--epsilon", "1",
                     "--batch-size", "3", "--max-tokens", "3", "--prompt", str(t), "-q",
                     *extra])
        return code, capsys.readouterr().err

    assert run(capsys, "budget", "reviews", "--epsilon", "1", "--delta", "1e-6")[0] == 0
    assert PrivacyLedger().budget("reviews") == (1.0, 1e-6)
    assert generate("a.jsonl", "--dataset", "reviews")[0] == 0
    (tmp_path / "reviews").write_text(rows)  # a file named like the dataset appears
    code, err = generate("b.jsonl", "--dataset", "reviews")  # still the exhausted budget
    assert code == 3 and not (tmp_path / "b.jsonl").exists()
    assert PrivacyLedger().datasets() == ["reviews"]
    # the ledger's NAME is a name as well, even where it is a file
    code, _, err = run(capsys, "budget", "reviews", "--epsilon", "3", "--delta", "1e-6")
    assert code == 0 and PrivacyLedger().budget("reviews") == (3.0, 1e-6)
    assert "--data" in err  # the data holder is told how to budget the file's default key
    code, out, _ = run(capsys, "show", "reviews", "--json")
    assert json.loads(out)["datasets"][0]["dataset"] == "reviews"
    # the default key of a file used without --dataset: `ledger budget --data FILE`
    resolved = str((tmp_path / "d.csv").resolve())
    assert run(capsys, "budget", "--data", "d.csv", "--epsilon", "2.5",
               "--delta", "1e-6")[0] == 0
    assert PrivacyLedger().budget(resolved) == (2.5, 1e-6)
    assert generate("c.jsonl")[0] == 0
    assert PrivacyLedger().spent(resolved).releases == 1
    code, out, _ = run(capsys, "show", "--data", "d.csv", "--json")
    assert json.loads(out)["datasets"][0]["dataset"] == resolved
    code, err = generate("e.jsonl", "--dataset", "other-name")
    assert code == 0
    assert "has its own budget" in err and "'other-name'" in err
    code, _, err = run(capsys, "budget", "x", "--data", "d.csv", "--epsilon", "1",
                       "--delta", "1e-6")
    assert code == 2 and "not both" in err


def test_views_and_a_generation_against_a_ledger_url_never_print_its_password(
        tmp_path, capsys, monkeypatch, postgres_server):
    monkeypatch.setattr(gen_cli, "_load_model",
                        lambda spec, dtype="float32": ToyModel(vocab_size=30, eos_after=None))
    role, password = postgres_server.password_role, postgres_server.password
    dbname = postgres_server.new_database("cli", owner=role).split("/")[3].split("?")[0]
    url = postgres_server.url(dbname, role, password)
    masked = mask_url(url)
    assert password not in masked
    printed = []

    def ledger_cmd(*args):
        code, out, err = run(capsys, *args, "--ledger", url)
        printed.append(out + err)
        return code, out, err

    code, out, err = ledger_cmd("budget", "reviews", "--epsilon", "5", "--delta", "1e-6")
    assert code == 0, err
    assert f"(ledger {masked})" in out
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "".join(f"review {i}\n" for i in range(6)))
    t = tmp_path / "t.toml"
    t.write_text('private = "Here: {reference}\\nAnother:"\npublic = "Another:"\n')
    code = main(["generate", "--data", str(data), "--out", str(tmp_path / "a.jsonl"),
                 "--epsilon", "2", "--batch-size", "3", "--max-tokens", "3", "--prompt", str(t),
                 "--dataset", "reviews", "--ledger", url, "--quiet"])
    captured = capsys.readouterr()
    printed.append(captured.out + captured.err)
    assert code == 0, captured.err
    private = json.loads((tmp_path / ".dplang-private" / "a.private.json").read_text())
    assert private["ledger"] == masked
    for f in tmp_path.iterdir():
        if f.is_file():
            assert password not in f.read_text(errors="replace"), f
    code, out, _ = ledger_cmd("show")
    assert code == 0 and out.startswith(f"ledger {masked} (private to the data holder")
    assert "dataset reviews" in out and "remaining ε = 3" in out
    code, out, _ = ledger_cmd("show", "reviews", "--json")
    doc = json.loads(out)
    assert doc["ledger"] == masked
    assert doc["datasets"][0]["dp"]["releases"] == 1
    assert doc["datasets"][0]["dp"]["total_epsilon"] == pytest.approx(2.0, rel=1e-6)
    # over the budget: refused (exit 3), nothing written
    code = main(["generate", "--data", str(data), "--out", str(tmp_path / "b.jsonl"),
                 "--epsilon", "5", "--batch-size", "3", "--max-tokens", "3", "--prompt", str(t),
                 "--dataset", "reviews", "--ledger", url, "--quiet"])
    captured = capsys.readouterr()
    printed.append(captured.out + captured.err)
    assert code == 3 and not (tmp_path / "b.jsonl").exists()
    assert all(password not in text for text in printed)


def test_a_pure_dp_spend_is_shown_with_delta_zero(tmp_path, capsys, default_ledger):
    """One pure-DP release (δ = 0) is shown as a total with δ = 0, not the default 1e-06."""
    ledger = PrivacyLedger()
    ledger.charge("pure", "rep-1", Guarantee("report", "record", "replace-one", None, 1.5, 0.0),
                  "dplang report → r")
    code, out, _ = run(capsys, "show", "pure")
    assert code == 0 and "total (ε = 1.5, δ = 0)" in out, out
    doc = json.loads(run(capsys, "show", "pure", "--json")[1])["datasets"][0]
    assert doc["dp"]["total_epsilon"] == 1.5 and doc["dp"]["total_delta"] == 0
    # with a zCDP release the total is stated at the budget's (or the asked) δ, as before
    ledger.charge("pure", "gen-1", _g(0.1), "dplang generate → a.jsonl")
    doc = json.loads(run(capsys, "show", "pure", "--json", "--delta", "1e-5")[1])["datasets"][0]
    assert doc["dp"]["total_delta"] == 1e-5


def test_a_write_killed_mid_commit_does_not_lock_the_ledger_out(tmp_path, capsys):
    """A process killed while it wrote (kill -9, OOM) leaves a hot rollback journal, which a
    read-only connection cannot roll back: the ledger was refused as "not a dplang ledger"
    by every command. It is rolled back, and what was committed stays."""
    import subprocess
    import sys

    path = tmp_path / "l.sqlite"
    PrivacyLedger(path).set_budget("d", epsilon=5, delta=1e-6)
    script = ("import os, sqlite3, sys\n"
              "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
              "db.execute('PRAGMA cache_size = 1')\n"
              "db.execute('BEGIN IMMEDIATE')\n"
              "db.execute('CREATE TABLE junk (x)')\n"
              "db.executemany('INSERT INTO junk VALUES (?)', [(i,) for i in range(20000)])\n"
              "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", script, str(path)], check=True)
    assert path.with_name("l.sqlite-journal").stat().st_size > 0  # the hot journal
    code, out, err = run(capsys, "show", "--ledger", str(path))
    assert code == 0 and "ε = 5" in out, err
    assert PrivacyLedger(path).budget("d") == (5, 1e-6)


def test_the_remaining_budget_is_at_the_budgets_delta(tmp_path, capsys):
    """``show --delta D`` states the total at D, but the room left is the budget's, at its own
    δ (a larger D gives a smaller total, never more room)."""
    from dplang.cli.ledger import dataset_summary

    path = tmp_path / "l.sqlite"
    book = PrivacyLedger(path)
    book.set_budget("a", epsilon=5, delta=1e-5)
    book.charge("a", "r1", _g(0.3), "x")
    at_budget = 5 - rho_to_epsilon(0.3, 1e-5)
    assert dataset_summary(book, "a")["remaining_epsilon"] == pytest.approx(at_budget)
    assert dataset_summary(book, "a", delta=0.01)["remaining_epsilon"] == \
        pytest.approx(at_budget)


def _strict_json(text):
    """Standard JSON only: ``Infinity`` and ``NaN`` (which Python writes and reads) refused."""
    def refuse(name):
        raise ValueError(f"not standard JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_show_json_is_standard_json_with_a_non_private_release(tmp_path, capsys):
    """A non-private release (ε = ∞) was written as ``Infinity``, which jq and most JSON
    parsers refuse; it is ``null``, and the release says ``not_private``."""
    path = tmp_path / "l.sqlite"
    book = PrivacyLedger(path)
    book.charge("d", "np-1", Guarantee.non_private("nonprivate", "reference", "replace-by-null"),
                "dplang generate (nonprivate) → a.jsonl")
    book.charge("d", "gen-1", _g(0.1), "dplang generate → b.jsonl")
    code, out, _ = run(capsys, "show", "--ledger", str(path), "--json")
    assert code == 0
    doc = _strict_json(out)["datasets"][0]
    by_id = {r["release_id"]: r for r in doc["releases"]}
    assert by_id["np-1"]["not_private"] is True and by_id["np-1"]["epsilon"] is None
    assert by_id["gen-1"]["not_private"] is False and by_id["gen-1"]["epsilon"] > 0
    assert doc["data_dependent"]["nominal_epsilon"] is None


def test_an_approximate_spend_above_the_shown_delta_is_its_sum(tmp_path, capsys):
    """Without zCDP releases the total is (Σε, Σδ) by basic composition: two (1, 1e-6)
    releases shown at δ = 1e-6 were "ε = ∞"; they are (2, 2e-6)."""
    path = tmp_path / "l.sqlite"
    book = PrivacyLedger(path)
    for i in range(2):
        book.charge("d", f"a-{i}", Guarantee.approximate("report", "record", "replace-one",
                                                          1.0, 1e-6), "x")
    code, out, _ = run(capsys, "show", "--ledger", str(path), "--delta", "1e-6")
    assert code == 0 and "total (ε = 2, δ = 2e-06; above the δ asked, 1e-06)" in out, out
    doc = _strict_json(run(capsys, "show", "--ledger", str(path), "--json")[1])["datasets"][0]
    assert doc["dp"]["total_epsilon"] == 2 and doc["dp"]["total_delta"] == pytest.approx(2e-6)


def test_a_budget_says_when_it_creates_the_ledger_and_when_its_delta_is_large(tmp_path,
                                                                               capsys):
    """A mistyped ``--ledger`` would hold a budget no release sees: setting it says that it
    created the ledger; a δ above 1e-3 is set, with a warning."""
    path = tmp_path / "typo.sqlite"
    code, _, err = run(capsys, "budget", "d", "--epsilon", "1", "--delta", "1e-6",
                       "--ledger", str(path))
    assert code == 0 and "there was no ledger at" in err and str(path) in err, err
    assert "is large" not in err
    code, _, err = run(capsys, "budget", "d", "--epsilon", "1", "--delta", "0.01",
                       "--ledger", str(path))
    assert code == 0 and "there was no ledger" not in err and "δ = 0.01 is large" in err, err
    assert PrivacyLedger(path).budget("d") == (1, 0.01)


def test_ctrl_c_stops_a_charge_waiting_for_the_ledger_lock(tmp_path):
    """SQLite's busy wait runs in C, where Python sees no signal: a charge waiting for another
    process's write lock did not stop on Ctrl-C until its 60 s timeout. It stops at once."""
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "l.sqlite"
    PrivacyLedger(path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time\n"
         "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "db.execute('BEGIN IMMEDIATE'); print('held', flush=True); time.sleep(60)\n",
         str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter = subprocess.Popen(
            [sys.executable, "-c", "import sys\nfrom dplang.privacy.ledger import PrivacyLedger\n"
             "book = PrivacyLedger(sys.argv[1]); print('waiting', flush=True)\n"
             "try:\n    book.set_budget('d', 1.0, 1e-6)\n"
             "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n",
             str(path)], stdout=subprocess.PIPE, text=True)
        assert waiter.stdout.readline().strip() == "waiting"
        time.sleep(1.0)  # inside the wait for the lock
        assert waiter.poll() is None
        sent = time.monotonic()
        waiter.send_signal(signal.SIGINT)
        out, _ = waiter.communicate(timeout=30)
        assert time.monotonic() - sent < 10 and out.strip() == "interrupted"
    finally:
        holder.kill()
        holder.wait()
    assert PrivacyLedger(path).budget("d") is None


def test_an_approximate_spend_of_delta_one_or_more_has_no_guarantee(tmp_path, capsys):
    """Σδ ≥ 1 without a budget (nothing refuses it): (Σε, 1) promises nothing; it is shown
    as no guarantee (ε = ∞, null in JSON), not as a finite total."""
    path = tmp_path / "l.sqlite"
    book = PrivacyLedger(path)
    for i in range(3):
        book.charge("d", f"a-{i}", Guarantee.approximate("report", "record", "replace-one",
                                                          1.0, 0.4), "x")
    code, out, _ = run(capsys, "show", "--ledger", str(path))
    assert code == 0 and "no guarantee: Σδ ≥ 1" in out, out
    doc = _strict_json(run(capsys, "show", "--ledger", str(path), "--json")[1])["datasets"][0]
    assert doc["dp"]["total_epsilon"] is None and doc["dp"]["total_delta"] == 1.0
