"""docs/privacy.md's "Which test audits which mechanism" table is what the tests' marks give.

``scripts/audit_table.py`` builds the table from ``@pytest.mark.audits(...)`` on the tests and
its catalogue of mechanisms; these tests fail when the documented table has drifted from the
marks, and show that the script refuses an unknown mechanism name, a catalogued code location
that does not exist, and a mechanism with neither a marked test nor a reason."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("audit_table", ROOT / "scripts" / "audit_table.py")
audit_table = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("audit_table", audit_table)  # dataclasses look their module up
_spec.loader.exec_module(audit_table)


def test_the_documented_table_is_the_one_the_marks_give():
    assert audit_table.documented() == audit_table.render(), (
        "docs/privacy.md's audit table differs from the marks: run "
        "python scripts/audit_table.py --write")


def test_every_catalogued_mechanism_is_audited_or_says_why():
    marked = audit_table.collect()
    covered = {name for m in marked for name in m.mechanisms}
    for mech in audit_table.CATALOGUE:
        assert mech.key in covered or mech.tests_note, mech.key
    # the audit tests named in the mutation check carry marks
    names = {m.name for m in marked}
    assert {"test_engine_exact_audit_against_the_printed_guarantee",
            "test_discrete_kary_release_path_noise_and_exact_audit",
            "test_product_sampler_release_path_zcdp_accounting"} <= names


def _tests_dir(tmp_path: Path, body: str) -> Path:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_x.py").write_text("import pytest\n\n\n" + body)
    return tests


def test_an_unknown_mechanism_name_is_refused(tmp_path):
    tests = _tests_dir(tmp_path, '@pytest.mark.audits("invisibleinc")\ndef test_a():\n    pass\n')
    with pytest.raises(ValueError, match="unknown mechanism 'invisibleinc'"):
        audit_table.render(tests=tests)


def test_marks_on_functions_classes_and_modules_are_read(tmp_path):
    tests = _tests_dir(tmp_path, 'pytestmark = pytest.mark.audits("m")\n\n\n'
                                 '@pytest.mark.audits("m", "n")\n'
                                 '@pytest.mark.parametrize("x", [1])\n'
                                 'def test_a(x):\n    pass\n\n\n'
                                 '@pytest.mark.audits("n")\nclass TestB:\n'
                                 '    @pytest.mark.audits("m")\n    def test_c(self):\n'
                                 '        pass\n')
    got = [(m.name, m.mechanisms) for m in audit_table.collect(tests)]
    assert got == [(None, ("m",)), ("test_a", ("m", "n")), ("TestB", ("n",)),
                   ("TestB::test_c", ("m",))]


def test_missing_code_and_unaudited_rows_are_refused(tmp_path):
    tests = _tests_dir(tmp_path, '@pytest.mark.audits("m")\ndef test_a():\n    pass\n')
    gone = audit_table.Mechanism("m", "M", ("privacy/audit.py:no_such_function",),
                                 ("privacy/guarantees.py:Guarantee.zcdp",))
    with pytest.raises(ValueError, match="defines no no_such_function"):
        audit_table.render((gone,), tests)
    ok = audit_table.Mechanism("m", "M", ("privacy/audit.py:exact_audit",),
                               ("privacy/guarantees.py:Guarantee.zcdp",))
    silent = audit_table.Mechanism("quiet", "Q", ("privacy/audit.py",), ())
    with pytest.raises(ValueError, match="quiet: no test is marked"):
        audit_table.render((ok, silent), tests)
    table = audit_table.render((ok,), tests)
    assert "| M | `privacy/audit.py` `exact_audit` | `privacy/guarantees.py` `Guarantee.zcdp` " \
           "| `tests/test_x.py::test_a` |" in table
