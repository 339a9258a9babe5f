import math

import pytest

from dplang.privacy import Guarantee, rho_to_epsilon
from dplang.privacy.ledger import BudgetExceeded, PrivacyLedger, to_replace_one


def _g(rho):
    return Guarantee("invisibleink", "reference", "replace-by-null", rho,
                     rho_to_epsilon(rho, 1e-6), 1e-6)


def test_charges_persist_and_budget_refuses(new_ledger):
    path = new_ledger()
    ledger = PrivacyLedger(path)
    ledger.set_budget("data", epsilon=5.0, delta=1e-6)
    assert ledger.charge("data", "run-1", _g(0.2))
    # idempotent per release id (resume)
    assert not ledger.charge("data", "run-1", _g(0.2))
    reopened = PrivacyLedger(path)
    assert reopened.spent("data").rho == pytest.approx(0.2)
    assert reopened.spent("data").epsilon_at(1e-6) == pytest.approx(rho_to_epsilon(0.2, 1e-6))
    with pytest.raises(BudgetExceeded):
        reopened.charge("data", "run-2", _g(0.4))
    assert not reopened.has_release("run-2")
    assert len(reopened.releases("data")) == 1


def test_no_budget_records_only(new_ledger):
    ledger = PrivacyLedger(new_ledger())
    assert ledger.budget("x") is None
    assert ledger.charge("x", "r", _g(100.0))
    with pytest.raises(BudgetExceeded):
        ledger.set_budget("x", 1.0, 1e-6)


def test_mixed_pure_and_zcdp(new_ledger):
    ledger = PrivacyLedger(new_ledger())
    ledger.set_budget("d", 3.0, 1e-6)
    pure = Guarantee("report", "record", "replace-by-null", None, 1.0, 0.0)
    ledger.charge("d", "a", pure)
    ledger.charge("d", "b", _g(0.05))
    spent = ledger.spent("d")
    assert spent.adjacency == "replace-by-null" and spent.converted == 0
    assert spent.epsilon_at(1e-6) == pytest.approx(1.0 + rho_to_epsilon(0.05, 1e-6))


def test_mixed_approximate_and_zcdp_spend_the_delta_once(new_ledger):
    """An (ε, δ) release without a ρ (e.g. a Gaussian report) beside a zCDP one: at total δ,
    the zCDP part is converted at the δ that is left, not at the whole δ again (which would
    count the approximate release's δ twice: a total over the budget's δ)."""
    ledger = PrivacyLedger(new_ledger())
    ledger.set_budget("d", 10.0, 1e-5)
    approx = Guarantee.approximate("report", "record", "replace-by-null", 1.0, 4e-6)
    ledger.charge("d", "a", approx)
    ledger.charge("d", "b", _g(0.05))
    spent = ledger.spent("d")
    assert spent.epsilon_at(1e-5) == pytest.approx(1.0 + rho_to_epsilon(0.05, 6e-6))
    assert spent.epsilon_at(1e-5) > 1.0 + rho_to_epsilon(0.05, 1e-5)
    assert spent.epsilon_at(4e-6) == math.inf  # no δ left for the zCDP part
    # the budget is checked against that total: a release that fits only if δ were counted
    # twice is refused
    room = 10.0 - spent.epsilon_at(1e-5)
    with pytest.raises(BudgetExceeded):
        ledger.charge("d", "c", Guarantee.pure("report", "record", "replace-by-null",
                                               room + 1e-3))


def test_mixed_adjacencies_are_stated_under_replace_one_by_group_privacy(new_ledger):
    """A replace-by-null release and a replace-one release of the same dataset are not summed
    as they are: the total is stated under replace-one, the replace-by-null release counted at
    group distance 2 (4ρ; a pure ε counts 2ε)."""
    ledger = PrivacyLedger(new_ledger())
    assert ledger.charge("d", "gen", _g(0.05))
    one = Guarantee("discrete-laplace", "record", "replace-one", None, 1.0, 0.0)
    [warning] = ledger.adjacency_warnings("d", one)
    assert "replace-one" in warning and "4ρ" in warning
    assert ledger.charge("d", "sample", one)
    spent = ledger.spent("d")
    assert spent.adjacency == "replace-one" and spent.converted == 1
    assert spent.rho == pytest.approx(0.2) and spent.approx_epsilon == pytest.approx(1.0)
    assert spent.epsilon_at(1e-6) == pytest.approx(rho_to_epsilon(0.2, 1e-6) + 1.0)
    assert ledger.adjacency_warnings("d", one) == []  # already mixed: nothing new
    # a pure replace-by-null release counts 2ε, an approximate one (2ε, δ(1 + e^ε))
    assert ledger.charge("d", "pure", Guarantee("x", "reference", "replace-by-null", None,
                                                0.5, 0.0))
    assert ledger.spent("d").approx_epsilon == pytest.approx(2.0)
    assert to_replace_one("replace-by-null", 0.1, 0.5, 1e-7) == pytest.approx(
        (0.4, 1.0, 1e-7 * (1 + math.exp(0.5))))
    assert to_replace_one("replace-one", 0.1, 0.5, 1e-7) == (0.1, 0.5, 1e-7)
    assert to_replace_one("add-remove", 0.0, 800.0, 1e-7)[2] == 1.0  # capped: no guarantee
    # the same releases under one adjacency only: summed as they are
    same = PrivacyLedger(new_ledger("same"))
    same.charge("d", "a", _g(0.05))
    same.charge("d", "b", _g(0.05))
    assert same.spent("d").adjacency == "replace-by-null"
    assert same.spent("d").rho == pytest.approx(0.1)


def test_budget_is_checked_against_the_converted_total(new_ledger):
    """The first release of another adjacency is refused when, with the earlier releases
    converted to replace-one, the total exceeds the budget, although its own cost fits."""
    ledger = PrivacyLedger(new_ledger())
    rho = 0.1
    budget = rho_to_epsilon(2 * rho, 1e-6) + 1.0  # room for ρ = 0.1 (as is) plus ε = 1
    ledger.set_budget("d", budget, 1e-6)
    assert ledger.charge("d", "gen", _g(rho))
    one = Guarantee("discrete-laplace", "record", "replace-one", None, 1.0, 0.0)
    with pytest.raises(BudgetExceeded, match="replace-one adjacency"):
        ledger.charge("d", "sample", one)  # 4ρ + 1 > budget
    assert ledger.spent("d").releases == 1
    assert ledger.charge("d", "gen2", _g(rho))  # the same adjacency still fits: 2ρ


def _adapmixed(eps=3.0):
    return Guarantee("adapmixed", "reference", "add-remove", None, eps, 1e-6, ex_ante=False)


def test_data_dependent_releases_are_kept_out_of_the_dp_total(new_ledger):
    ledger = PrivacyLedger(new_ledger())
    assert ledger.charge("d", "dp", _g(0.05))
    assert ledger.charge("d", "ada", _adapmixed())
    spent = ledger.spent("d")
    assert spent.releases == 2 and spent.dp_releases == 1 and spent.data_dependent == 1
    assert spent.rho == pytest.approx(0.05) and spent.approx_epsilon == 0
    assert spent.data_dependent_epsilon == 3.0
    assert spent.epsilon_at(1e-6) == pytest.approx(rho_to_epsilon(0.05, 1e-6))
    assert [r["ex_ante"] for r in ledger.releases("d")] == [True, False]
    # a dataset with a DP budget refuses a release that has no DP guarantee
    ledger.set_budget("e", 100.0, 1e-6)
    with pytest.raises(BudgetExceeded, match="data-dependent"):
        ledger.charge("e", "ada2", _adapmixed(0.1))
    assert ledger.spent("e").releases == 0


def test_content_warnings(new_ledger):
    ledger = PrivacyLedger(new_ledger())
    assert ledger.content_warnings("a", "h1") == []
    ledger.charge("a", "r1", _g(0.01), data_digest="h1")
    assert ledger.content_warnings("a", "h1") == []
    [changed] = ledger.content_warnings("a", "h2")
    assert "other content" in changed and "h1" not in changed and "h2" not in changed
    [shared] = ledger.content_warnings("b", "h1")
    assert "'a'" in shared


def test_ledger_file_is_private_and_old_ledgers_migrate(tmp_path):
    import os
    import sqlite3

    path = tmp_path / "new" / "l.sqlite"
    old_umask = os.umask(0)
    try:
        PrivacyLedger(path)
    finally:
        os.umask(old_umask)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    # a ledger written before the ex_ante / data_digest columns existed
    old = tmp_path / "old.sqlite"
    db = sqlite3.connect(old)
    db.executescript(
        "CREATE TABLE budgets (dataset TEXT PRIMARY KEY, epsilon REAL NOT NULL, delta REAL "
        "NOT NULL, created REAL NOT NULL);"
        "CREATE TABLE releases (release_id TEXT PRIMARY KEY, dataset TEXT NOT NULL, created "
        "REAL NOT NULL, mechanism TEXT NOT NULL, rho REAL, epsilon REAL NOT NULL, delta REAL "
        "NOT NULL, guarantee TEXT NOT NULL, description TEXT NOT NULL);")
    for rid, g in (("x", _g(0.1)), ("y", _adapmixed())):
        db.execute("INSERT INTO releases VALUES (?, 'd', 0, ?, ?, ?, ?, ?, '')",
                   (rid, g.mechanism, g.rho, g.epsilon, g.delta, g.to_json()))
    db.commit()
    db.close()
    spent = PrivacyLedger(old).spent("d")
    assert spent.releases == 2 and spent.data_dependent == 1 and spent.rho == pytest.approx(0.1)


def _race(path: str, release_id: str, start: float, out) -> None:
    """Child process: charge ρ = 0.3 against a budget that holds one such charge only. The
    spend is read, then the process sleeps before inserting, so that a ledger without a
    write lock around read-check-insert would let both children through."""
    import time

    from dplang.privacy import ledger as ledger_mod

    real = ledger_mod.PrivacyLedger._spent

    def slow_spent(db, dataset):
        result = real(db, dataset)
        time.sleep(0.5)
        return result

    ledger_mod.PrivacyLedger._spent = staticmethod(slow_spent)
    book = ledger_mod.PrivacyLedger(path)
    while time.time() < start:
        time.sleep(0.005)
    try:
        out.put((release_id, bool(book.charge("d", release_id, _g(0.3)))))
    except ledger_mod.BudgetExceeded:
        out.put((release_id, False))


def test_two_processes_charging_at_once_never_exceed_the_budget(new_ledger):
    """Both backends (SQLite: one file; PostgreSQL: one database, the dataset's advisory
    lock); tests/privacy/test_ledger_postgres.py races more processes on PostgreSQL."""
    import multiprocessing
    import time

    path = new_ledger()
    ledger = PrivacyLedger(path)
    budget = rho_to_epsilon(0.5, 1e-6)  # room for one charge of ρ = 0.3, not two
    ledger.set_budget("d", budget, 1e-6)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = time.time() + 3.0
    procs = [ctx.Process(target=_race, args=(str(path), f"r{i}", start, out)) for i in (1, 2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sorted(results.values()) == [False, True]  # exactly one wins
    spent = PrivacyLedger(path).spent("d")
    assert spent.releases == 1 and spent.epsilon_at(1e-6) <= budget


def test_check_charge_is_the_charge_rule_without_recording(new_ledger):
    """A command checks the budget before it reads data or loads a model, by the
    charge's own rule and message, recording nothing."""
    ledger = PrivacyLedger(new_ledger())
    ledger.check_charge("data", _g(5.0))  # no budget: nothing refused
    ledger.set_budget("data", epsilon=3.0, delta=1e-6)
    ledger.check_charge("data", _g(0.1))
    with pytest.raises(BudgetExceeded) as checked:
        ledger.check_charge("data", _g(5.0))
    with pytest.raises(BudgetExceeded) as charged:
        ledger.charge("data", "run-1", _g(5.0))
    assert str(checked.value) == str(charged.value)
    data_dependent = Guarantee("adapmixed", "reference", "replace-by-null", None, 1.0, 1e-6,
                               ex_ante=False)
    with pytest.raises(BudgetExceeded, match="data-dependent"):
        ledger.check_charge("data", data_dependent)
    assert ledger.releases("data") == []


def test_check_charges_refuses_a_set_that_the_charges_would_stop_halfway(new_ledger):
    """Several releases each under the budget, together over it: refused before any is
    charged, by the charge's own rule; the non-private ceiling is named as what it is."""
    ledger = PrivacyLedger(new_ledger())
    ledger.set_budget("data", epsilon=3.0, delta=1e-6)
    ledger.check_charges("data", [_g(0.05), _g(0.05)])  # ε ≈ 2.5 together
    with pytest.raises(BudgetExceeded, match="4 releases refused"):
        ledger.check_charges("data", [_g(0.05)] * 4)  # ε ≈ 3.5 together, 1.7 each
    ceiling = Guarantee.non_private("nonprivate", "reference", "replace-by-null")
    with pytest.raises(BudgetExceeded, match="non-private ceiling") as refused:
        ledger.check_charges("data", [_g(0.1), ceiling])
    assert "data-dependent" not in str(refused.value)
    ledger.check_charges("other", [_g(100.0), ceiling])  # no budget: nothing refused
    assert ledger.releases("data") == []
