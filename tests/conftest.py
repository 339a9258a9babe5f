import pytest


@pytest.fixture(autouse=True)
def _private_ledger(tmp_path_factory, monkeypatch):
    """Never let a test touch the user's real privacy ledger."""
    monkeypatch.setenv("DPLANG_LEDGER", str(tmp_path_factory.mktemp("ledger") / "l.sqlite"))
