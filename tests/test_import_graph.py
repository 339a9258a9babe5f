"""The modules of dplang import each other without circles (scripts/import_cycles.py), the
modules split to cut them keep their earlier import paths, and the executor factory imports a
backend only when it is asked for."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "import_cycles.py"


def _script():
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_circles():
    script = _script()
    assert script.circles(script.import_graph()) == []


def test_the_cycle_finder_finds_a_circle_through_a_lazy_and_a_type_checking_import(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from .b import g\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from pkg.c import h\n")
    (package / "c.py").write_text("from pkg import a\n")
    (package / "d.py").write_text("from . import a\n")
    script = _script()
    assert script.circles(script.import_graph(package)) == [("pkg.a", "pkg.b", "pkg.c")]


@pytest.mark.parametrize(("module", "name"), [
    ("dplang.textgen.executors_ray", "RayExecutor"),
    ("dplang.textgen.executors", "LocalExecutor"),
    ("dplang.textgen.executors", "RayExecutor"),
    ("dplang.textgen.orchestration", "GenerationRequest"),
    ("dplang.models.default", "cache_dir"),
    ("dplang.models.transformers", "RowDecodeState"),
    ("dplang.models.transformers", "RowSlot"),
    ("dplang.privacy.accounting", "rho_to_epsilon"),
    ("dplang.privacy.accounting", "epsilon_to_rho"),
    ("dplang.sampling.evaluation", "tv_distance"),
    ("dplang.evaluation", "ALL_METRICS"),
    ("dplang.evaluation", "EvaluationSettings"),
    ("dplang.evaluation.harness", "EvaluationSettings"),
    ("dplang.evaluation.metrics", "ScoringModels"),
    ("dplang.evaluation.registry", "MetricContext"),
    ("dplang.evaluation.registry", "RealSideCache"),
])
def test_earlier_import_paths_still_work(module, name):
    assert getattr(importlib.import_module(module), name) is not None


def test_the_executor_factory_imports_a_backend_only_when_asked():
    script = (
        "import sys\n"
        "from dplang.textgen.executors import make_executor\n"
        "make_executor('inline')\n"
        "assert 'dplang.textgen.executors.local' not in sys.modules\n"
        "assert 'dplang.textgen.executors.ray' not in sys.modules\n"
        "make_executor('local', 2)\n"
        "assert 'dplang.textgen.executors.local' in sys.modules\n"
        "assert 'dplang.textgen.executors.ray' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
