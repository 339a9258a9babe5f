"""dplang: differentially private language generation.

Every public function that touches private data returns its result together with a
:class:`dplang.privacy.Guarantee` describing what the release promises. The commands are one
call each (:mod:`dplang.api`, ``docs/api.md``)::

    import dplang
    result = dplang.generate(texts, epsilon=3, dataset="my-texts")
    result.texts, result.guarantee

``import dplang`` stays light: the API's modules (and torch) load on first use.
"""

from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("dplang")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

#: The Python API (:mod:`dplang.api`), loaded on first use.
_API = ("generate", "report", "sample", "account", "DPLangError", "DPLangWarning",
        "Interrupted", "GenerationResult", "ReportResult", "SampleResult")

__all__ = ["__version__", *_API]


#: Subpackages reachable as attributes (``dplang.models.resolve_model``), imported on use.
_SUBMODULES = ("api", "evaluation", "experiments", "formal", "io", "models", "privacy",
               "release", "reports", "sampling", "textgen")


def __getattr__(name: str) -> Any:  # PEP 562
    if name in _API:
        from . import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'dplang' has no attribute {name!r}")
