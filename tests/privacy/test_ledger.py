import pytest

from dplang.privacy import Guarantee, rho_to_epsilon
from dplang.privacy.ledger import BudgetExceeded, PrivacyLedger


def _g(rho):
    return Guarantee("invisibleink", "reference", "replace-by-null", rho,
                     rho_to_epsilon(rho, 1e-6), 1e-6)


def test_charges_persist_and_budget_refuses(tmp_path):
    path = tmp_path / "ledger.sqlite"
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


def test_no_budget_records_only(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    assert ledger.budget("x") is None
    assert ledger.charge("x", "r", _g(100.0))
    with pytest.raises(BudgetExceeded):
        ledger.set_budget("x", 1.0, 1e-6)


def test_mixed_pure_and_zcdp(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.set_budget("d", 3.0, 1e-6)
    ledger.charge("d", "a", Guarantee("report", "record", "replace-one", None, 1.0, 0.0))
    ledger.charge("d", "b", _g(0.05))
    spent = ledger.spent("d")
    assert spent.epsilon_at(1e-6) == pytest.approx(1.0 + rho_to_epsilon(0.05, 1e-6))
