"""The PostgreSQL ledger: URLs, masking, errors, the schema, and processes
racing on one budget. The behaviour both backends share is in tests/privacy/test_ledger.py
(parametrised over SQLite and PostgreSQL); the server is the session's throw-away cluster
(tests/conftest.py ``postgres_server``). The CLI is imported inside the tests: the racing
child processes import this module, and should not pay for the whole CLI."""

import sys
from pathlib import Path

import pytest

from dplang.privacy import Guarantee, rho_to_epsilon
from dplang.privacy.ledger import LedgerError, PrivacyLedger, check_ledger_path
from dplang.privacy.ledger_backends import (
    PostgresBackend,
    SQLiteBackend,
    advisory_key,
    is_ledger_url,
    ledger_location,
    mask_url,
)

UNREACHABLE = "postgresql://alice:s3cret-pw@/ledger?host=/nonexistent-dplang-socket-dir"


def _g(rho):
    return Guarantee("invisibleink", "reference", "replace-by-null", rho,
                     rho_to_epsilon(rho, 1e-6), 1e-6)


def test_urls_are_told_from_paths_and_masked(monkeypatch, tmp_path):
    assert is_ledger_url("postgresql://u@h/db") and is_ledger_url("POSTGRES://h/db")
    assert not is_ledger_url(Path("postgresql://u@h/db")) and not is_ledger_url("l.sqlite")
    assert mask_url("postgresql://alice:s3cret@db.example:5432/ledger?sslmode=require") == (
        "postgresql://alice:***@db.example:5432/ledger?sslmode=require")
    assert mask_url("postgres://alice@h/db?sslmode=require&password=s3cret") == (
        "postgres://alice@h/db?sslmode=require&password=***")
    assert mask_url("postgresql://h/db") == "postgresql://h/db"
    assert ledger_location("postgresql://u@h/db") == "postgresql://u@h/db"
    assert ledger_location(tmp_path / "l.sqlite") == tmp_path / "l.sqlite"
    # a URL made into a Path has lost a '/': refused, not taken for a file, password masked
    with pytest.raises(LedgerError, match="lost a '/'") as err:
        ledger_location(Path("postgresql://alice:s3cret@h/db"))
    assert "s3cret" not in str(err.value)
    monkeypatch.setenv("DPLANG_LEDGER", "postgresql://u@h/db")
    assert ledger_location(None) == "postgresql://u@h/db"
    assert isinstance(ledger_location("l.sqlite"), Path)
    # one lock key per dataset name, the same in every process
    assert advisory_key("reviews") == advisory_key("reviews") != advisory_key("reviews2")
    assert -2**63 <= advisory_key("reviews") < 2**63


def test_psycopg_missing_is_a_one_line_error_naming_the_extra(monkeypatch, capsys):
    from dplang.cli.app import main

    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg → ImportError
    with pytest.raises(LedgerError, match=r"pip install 'dplang\[postgres\]'") as err:
        PrivacyLedger(UNREACHABLE)
    assert "s3cret" not in str(err.value) and "alice:***@" in str(err.value)
    assert main(["ledger", "show", "--ledger", UNREACHABLE]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: ") and stderr.count("\n") == 1
    assert "dplang[postgres]" in stderr and "s3cret" not in stderr


def test_unreachable_server_is_a_one_line_error_without_the_password(
        tmp_path, monkeypatch, capsys):
    from dplang.cli.app import main

    pytest.importorskip("psycopg", reason="psycopg is not installed")
    with pytest.raises(LedgerError, match="cannot be reached") as err:
        check_ledger_path(UNREACHABLE)
    message = str(err.value)
    assert "\n" not in message and "s3cret" not in message and "alice:***@" in message
    for args in (["ledger", "show", "--ledger", UNREACHABLE],
                 ["ledger", "budget", "d", "--epsilon", "1", "--delta", "1e-6", "--ledger",
                  UNREACHABLE]):
        assert main(args) == 2
        out = capsys.readouterr()
        assert out.err.startswith("error: ledger postgresql://alice:***@")
        assert out.err.count("\n") == 1 and "Traceback" not in out.err
        assert "s3cret" not in out.err + out.out
    # DPLANG_LEDGER as a URL: the same
    monkeypatch.setenv("DPLANG_LEDGER", UNREACHABLE)
    assert main(["ledger", "show"]) == 2
    assert "cannot be reached" in capsys.readouterr().err
    # a generation checks the ledger before reading data or loading a model: nothing written
    data = tmp_path / "d.csv"
    data.write_text("text\na\nb\n")
    out = tmp_path / "g.jsonl"
    assert main(["generate", "--data", str(data), "--out", str(out), "--epsilon", "1",
                 "--ledger", UNREACHABLE, "-q"]) == 2
    err_text = capsys.readouterr().err
    assert "cannot be reached" in err_text and "s3cret" not in err_text
    assert not out.exists()
    # not a valid URL
    with pytest.raises(LedgerError, match="not a valid PostgreSQL URL"):
        check_ledger_path("postgresql://u:pw@h/db?no_such_option=1")


def test_refused_login_and_a_password_url(postgres_server):
    role, password = postgres_server.password_role, postgres_server.password
    db = postgres_server.new_database("pw", owner=role)
    dbname = db.split("/")[3].split("?")[0]
    wrong = postgres_server.url(dbname, role, "wrong-battery-3")
    with pytest.raises(LedgerError, match="refused the login") as err:
        PrivacyLedger(wrong)
    assert "wrong-battery-3" not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(LedgerError, match="refused the login"):  # no password at all
        PrivacyLedger(postgres_server.url(dbname, role))
    right = postgres_server.url(dbname, role, password)
    book = PrivacyLedger(right)
    assert book.path is None and password not in book.location
    assert book.location == mask_url(right) and f"{role}:***@" in book.location
    assert book.charge("d", "r1", _g(0.1)) and book.datasets() == ["d"]
    with pytest.raises(LedgerError, match="does not exist"):
        PrivacyLedger(postgres_server.url("no_such_db"))


def test_the_schema_is_the_sqlites(postgres_server, tmp_path):
    pg = PrivacyLedger(postgres_server.new_database())
    lite = PrivacyLedger(tmp_path / "l.sqlite")
    with pg._connect() as a, lite._connect() as b:
        assert pg._backend.columns(a) == lite._backend.columns(b)
    assert isinstance(pg._backend, PostgresBackend)
    assert isinstance(lite._backend, SQLiteBackend)
    # ε and δ keep double precision (PostgreSQL's REAL is single precision)
    pg.set_budget("d", 1.0000000001, 1e-6)
    assert pg.budget("d") == (1.0000000001, 1e-6)
    pg.set_budget("d", 2.0, 1e-7)  # replaced, not added
    assert pg.budget("d") == (2.0, 1e-7)


def test_a_database_with_other_tables_of_these_names_is_refused(postgres_server):
    url = postgres_server.new_database("foreign")
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE releases (id INTEGER)")
    with pytest.raises(LedgerError, match="not a dplang ledger"):
        check_ledger_path(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE budgets (dataset TEXT)")
    with pytest.raises(LedgerError, match="lacks column"):
        PrivacyLedger(url)


def _race(url: str, release_id: str, ready, out) -> None:
    """Child process: charge ρ = 0.3 to dataset "d" as soon as every child is ready (the
    ``ready`` barrier); the spend is read, then the process sleeps before inserting, so that a
    ledger without a lock around read-check-insert would let every child through."""
    import time

    from dplang.privacy import ledger as ledger_mod

    real = ledger_mod.PrivacyLedger._spent

    def slow_spent(db, dataset):
        result = real(db, dataset)
        time.sleep(0.3)
        return result

    ledger_mod.PrivacyLedger._spent = staticmethod(slow_spent)
    book = ledger_mod.PrivacyLedger(url)
    ready.wait(timeout=120)
    try:
        out.put((release_id, bool(book.charge("d", release_id, _g(0.3)))))
    except ledger_mod.BudgetExceeded:
        out.put((release_id, False))
    except Exception as exc:  # reported, not hidden in a child's traceback
        out.put((release_id, f"{type(exc).__name__}: {exc}"))


def test_processes_racing_on_one_budget_record_exactly_the_releases_that_fit(postgres_server):
    import multiprocessing

    url = postgres_server.new_database("race")
    book = PrivacyLedger(url)
    budget = rho_to_epsilon(0.65, 1e-6)  # room for two charges of ρ = 0.3, not three
    book.set_budget("d", budget, 1e-6)
    book.charge("other", "o1", _g(5.0))  # another dataset, no budget: not in the way
    ctx = multiprocessing.get_context("spawn")
    out, ready = ctx.Queue(), ctx.Barrier(4)
    procs = [ctx.Process(target=_race, args=(url, f"r{i}", ready, out)) for i in range(4)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(isinstance(v, bool) for v in results.values()), results
    winners = sorted(r for r, ok in results.items() if ok)
    assert len(winners) == 2  # exactly the two that fit
    recorded = sorted(r["release_id"] for r in book.releases("d"))
    assert recorded == winners
    spent = book.spent("d")
    assert spent.rho == pytest.approx(0.6) and spent.epsilon_at(1e-6) <= budget


@pytest.mark.parametrize(("url", "secrets"), [
    # libpq reads a password up to the first '@' ('?' and '#' are part of it)
    ("postgresql://alice:pa#ss?wd@db.example/ledger", ["pa#ss?wd", "pa", "ss"]),
    ("postgresql://al#ice:s3cret@db.example/ledger", ["s3cret"]),
    ("postgres://alice@h/db?sslmode=require&password=ab#cd", ["ab#cd", "cd"]),
    ("postgresql://alice@h/db?sslpassword=key-passphrase", ["key-passphrase"]),
    # unencoded '@' or '/' in a password: libpq misreads the URL, but no piece may be printed
    ("postgresql://alice:p4@ss-word@h/db", ["p4@ss-word", "ss-word"]),
    ("postgresql://alice:pa55/word@h/db", ["pa55/word", "pa55", "word@h"]),
])
def test_every_password_form_libpq_reads_is_masked(url, secrets):
    masked = mask_url(url)
    assert not [s for s in secrets if s in masked], masked
    assert masked.startswith(url.split(":")[0] + "://")
    # messages quoting the password or a piece of it are blanked too
    backend = PostgresBackend(url)
    for secret in secrets:
        text = backend._clean(RuntimeError(f'bad value "{secret}" in {url}'))
        assert secret not in text, text


def test_a_password_with_hash_and_question_marks_is_never_printed(postgres_server, capsys):
    """``?`` and ``#`` are ordinary characters of a URL's password for libpq (it reads the URL):
    ``ledger show`` must not print it."""
    from dplang.cli.app import main

    role, password = "dplang_hash", "pa#ss?wd-9"
    postgres_server.admin(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    dbname = postgres_server.new_database("hash", owner=role).split("/")[3].split("?")[0]
    url = f"postgresql://{role}:{password}@/{dbname}?host={postgres_server.socket_dir}"
    assert main(["ledger", "show", "--ledger", url]) == 0
    out = capsys.readouterr()
    assert "no datasets yet" in out.out
    assert "pa#ss" not in out.out + out.err and "ss?wd" not in out.out + out.err


def test_a_login_whose_own_schema_would_hide_the_teams_ledger_is_refused(postgres_server):
    """PostgreSQL's default search_path is ``"$user", public``: an analyst with a schema of
    their own name would create (and charge) a second, empty ledger there instead of the
    team's: two budgets for one dataset. Refused, naming the schema that holds the ledger."""
    url = postgres_server.new_database("team")
    dbname = url.split("/")[3].split("?")[0]
    team = PrivacyLedger(url)  # the team's ledger, in schema public
    team.set_budget("d", rho_to_epsilon(0.35, 1e-6), 1e-6)
    assert team.charge("d", "r1", _g(0.3))
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE ROLE dplang_bob LOGIN")
        conn.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO dplang_bob")
        conn.execute("CREATE SCHEMA dplang_bob AUTHORIZATION dplang_bob")
    bob = postgres_server.url(dbname, "dplang_bob")
    with pytest.raises(LedgerError, match=r"schema public") as err:
        PrivacyLedger(bob).charge("d", "r2", _g(0.3))
    assert "search_path" in str(err.value)
    # pointed at the team's schema, bob charges the team's budget (and is refused over it)
    from dplang.privacy.ledger import BudgetExceeded

    pinned = PrivacyLedger(bob + "&options=-csearch_path%3Dpublic")
    with pytest.raises(BudgetExceeded):
        pinned.charge("d", "r2", _g(0.3))
    assert [r["release_id"] for r in team.releases("d")] == ["r1"]


def test_a_client_gone_quiet_inside_a_charge_does_not_hold_the_dataset_lock(
        postgres_server, monkeypatch):
    """A client that stops mid-charge (a machine cut off the network, a stopped process) would
    hold the dataset's advisory lock until the server notices, blocking every charge of the
    dataset: idle inside a charge's transaction for IDLE_IN_CHARGE_S, its session is ended
    (its charge rolled back, a one-line error if it wakes up) and the next charge goes on."""
    import threading
    import time

    from dplang.privacy import ledger_backends

    monkeypatch.setattr(ledger_backends, "IDLE_IN_CHARGE_S", 1, raising=False)
    url = postgres_server.new_database("idle")
    book = PrivacyLedger(url)
    held, outcome = threading.Event(), []

    def quiet_holder():
        try:
            with book._backend.write("d"):  # takes the lock, then goes quiet
                held.set()
                time.sleep(8)
            outcome.append("committed")
        except LedgerError as exc:
            outcome.append(str(exc))

    holder = threading.Thread(target=quiet_holder)
    holder.start()
    assert held.wait(30)
    start = time.monotonic()
    assert book.charge("d", "r1", _g(0.1))
    waited = time.monotonic() - start
    holder.join(30)
    assert waited < 5, waited
    assert outcome and outcome[0] != "committed" and "\n" not in outcome[0]
