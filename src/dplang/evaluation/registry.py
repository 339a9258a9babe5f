"""The metric registry: one frozen :class:`MetricSpec` per metric, looked up by name.

The harness (:func:`dplang.evaluation.harness.evaluate_runs`) only loops over the specs of the
metrics asked for; the report (``report.md``, ``metrics.png``) only loops over their
:class:`RunValue` entries. Adding a metric is one module that builds a spec and calls
:func:`register_metric` (the built-ins are in :mod:`dplang.evaluation.metrics`; a module listed
in :data:`BUILTIN_MODULES` is registered whenever the registry is used, so ``dplang evaluate
--metrics NAME`` knows it)::

    def _compute(ctx: MetricContext) -> MetricOutput:
        scores = [my_score(run.texts, ctx.real.texts) for run in ctx.runs]
        return MetricOutput(settings={"version": 1},
                            runs=[{"score": s} for s in scores])

    register_metric(MetricSpec(
        name="myscore", compute=_compute,
        aggregate=(RunValue("myscore", ("score",), higher_is_better=True,
                            header="my score"),),
        default=False))

A spec's ``compute`` receives the aligned inputs (:class:`MetricContext`) and returns a
:class:`MetricOutput`; the harness writes ``settings[name]``, ``real[name]`` and each run's
``runs[i][name]`` from it, and ``aggregate[key]`` (a 99% Wald interval over runs) for every
:class:`RunValue`. Metric names, aggregate keys and the layout of ``metrics.json`` are an
interface: ``dplang evaluate``, the experiment runner and their readers depend on them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# What a metric is given lives in the context module (re-exported here, where a metric's
# author looks for it).
from dplang.evaluation.context import REAL_SIDE_CACHE, MetricContext, RealSideCache

if TYPE_CHECKING:
    from dplang.evaluation.context import EvaluationSettings
    from dplang.evaluation.data import SyntheticRun

__all__ = [
    "REAL_SIDE_CACHE",
    "MetricContext",
    "MetricOutput",
    "MetricSpec",
    "RealSideCache",
    "RunValue",
    "default_metrics",
    "get_metric",
    "metric_names",
    "register_metric",
    "resolve_metric_name",
]

Path_ = tuple[str, ...]


def lookup(entry: Any, path: Path_) -> Any:
    """``entry[path[0]][path[1]]...``, or ``None`` where a key is missing."""
    for key in path:
        if not isinstance(entry, dict) or key not in entry:
            return None
        entry = entry[key]
    return entry


@dataclass(frozen=True)
class RunValue:
    """One number a metric reports for every synthetic run.

    ``path`` locates it in the run's entry of the metric (``runs[i][metric]``); the harness
    aggregates it over runs into ``aggregate[key]``; the report shows it as the results-table
    column ``header`` and the plot panel ``panel`` (default: ``header``), with its per-run
    ``half_width`` (a path, if any), the real texts' interval at ``real`` (a path in
    ``real[metric]``, if any), multiplied by ``scale`` and printed with ``digits`` decimals.
    ``paren_half_width`` prints ``v (± h)`` (an interval of a difference) instead of ``v ± h``.
    ``higher_is_better``: ``True``/``False``, or ``None`` for a descriptive value that is best
    when close to the real texts'."""

    key: str
    path: Path_
    higher_is_better: bool | None
    header: str
    panel: str | None = None
    half_width: Path_ | None = None
    real: Path_ | None = None
    scale: float = 1.0
    digits: int = 2
    paren_half_width: bool = False

    def value(self, entry: dict[str, Any] | None) -> Any:
        return lookup(entry, self.path)

    def interval(self, entry: dict[str, Any] | None) -> tuple[Any, Any]:
        """(value, half width) of one run's metric entry."""
        hw = lookup(entry, self.half_width) if self.half_width is not None else None
        return self.value(entry), hw


@dataclass(frozen=True)
class MetricOutput:
    """What a metric computed: its ``settings`` entry, the real texts' entry (``real``, if it
    scores them) and one entry per synthetic run, in the order of ``MetricContext.runs``."""

    runs: list[dict[str, Any]]
    settings: dict[str, Any] | None = None
    real: dict[str, Any] | None = None


@dataclass(frozen=True)
class MetricSpec:
    """One metric: how to compute it, which per-run values are aggregated over runs, and
    whether higher is better for each (``aggregate``).

    Optional hooks, all called before any metric is computed: ``preflight(settings)`` (fail
    fast on a bad model or embedder before the inputs are read), ``select(runs, explicit)``
    (return a warning to skip the metric for these runs when it was not asked for explicitly,
    or raise :class:`~dplang.evaluation.data.EvaluationError`), ``prepare(ctx)`` (checks on the
    aligned inputs). ``describe(settings_entry)`` is the metric's line under "Settings" in
    ``report.md``; ``plots(result, out_dir)`` writes extra files (figures, tables; mode 600)
    and returns their paths.
    ``columns`` orders the table columns and panels (default: ``aggregate``'s order).
    ``default``: part of the metrics computed when none are named."""

    name: str
    compute: Callable[[MetricContext], MetricOutput]
    aggregate: tuple[RunValue, ...]
    aliases: tuple[str, ...] = ()
    default: bool = True
    preflight: Callable[[EvaluationSettings], None] | None = None
    select: Callable[[Sequence[SyntheticRun], bool], str | None] | None = None
    prepare: Callable[[MetricContext], None] | None = None
    describe: Callable[[dict[str, Any] | None], str] | None = None
    plots: Callable[[dict[str, Any], Any], list[Any]] | None = None
    columns: tuple[str, ...] = field(default=())

    @property
    def higher_is_better(self) -> dict[str, bool | None]:
        """Per aggregate key: ``True``, ``False`` or ``None`` (closest to the real texts)."""
        return {v.key: v.higher_is_better for v in self.aggregate}

    def ordered_values(self) -> tuple[RunValue, ...]:
        """The aggregate values in table / plot order."""
        if not self.columns:
            return self.aggregate
        by_key = {v.key: v for v in self.aggregate}
        return tuple(by_key[k] for k in self.columns)


_METRICS: dict[str, MetricSpec] = {}
_ALIASES: dict[str, str] = {}


def register_metric(spec: MetricSpec, *, replace: bool = False) -> MetricSpec:
    """Add ``spec`` to the registry (``replace``: allow a name already registered). Names and
    aliases are lower case; an aggregate key may belong to one metric only."""
    _builtins()
    name = spec.name.strip().lower()
    if name != spec.name or not name:
        raise ValueError(f"metric names are non-empty and lower case, got {spec.name!r}")
    if name in _METRICS and not replace:
        raise ValueError(f"metric {name!r} is already registered")
    others = {v.key for s in _METRICS.values() if s.name != name for v in s.aggregate}
    clash = [v.key for v in spec.aggregate if v.key in others]
    if clash:
        raise ValueError(f"aggregate key {clash[0]!r} already belongs to another metric")
    for alias in spec.aliases:
        owner = _ALIASES.get(alias, name)
        if alias in _METRICS or owner != name:
            raise ValueError(f"alias {alias!r} of metric {name!r} is already taken")
    _METRICS[name] = spec
    for alias in spec.aliases:
        _ALIASES[alias] = name
    return spec


#: The modules whose import registers dplang's own metrics, in report order: a new built-in
#: metric is a new module and one line here.
BUILTIN_MODULES: tuple[str, ...] = ("dplang.evaluation.metrics",
                                     "dplang.evaluation.downstream")
_loading: list[bool] = []
_loaded: list[bool] = []


def _builtins() -> None:
    """Register the built-in metrics (first call only)."""
    if _loading or _loaded:
        return
    _loading.append(True)
    try:
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        _loaded.append(True)
    finally:
        _loading.clear()


def _order(spec: MetricSpec) -> int:
    """Built-in metrics in the order of :data:`BUILTIN_MODULES` (whichever module happened to
    be imported first), then the others."""
    module = getattr(spec.compute, "__module__", None)
    return BUILTIN_MODULES.index(module) if module in BUILTIN_MODULES else len(BUILTIN_MODULES)


def metric_names() -> tuple[str, ...]:
    """Every registered metric, in report order: the built-ins in the order of
    :data:`BUILTIN_MODULES` (and of registration within a module), then the others in
    registration order."""
    _builtins()
    return tuple(sorted(_METRICS, key=lambda name: _order(_METRICS[name])))


def default_metrics() -> tuple[str, ...]:
    """The metrics computed when none are named."""
    return tuple(name for name in metric_names() if _METRICS[name].default)


def resolve_metric_name(name: str) -> str | None:
    """The registered name of ``name`` or of its alias (case-insensitive), else ``None``."""
    _builtins()
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in _METRICS else None


def get_metric(name: str) -> MetricSpec:
    """The spec registered under ``name`` (or an alias); ``KeyError`` if none."""
    resolved = resolve_metric_name(name)
    if resolved is None:
        raise KeyError(name)
    return _METRICS[resolved]
