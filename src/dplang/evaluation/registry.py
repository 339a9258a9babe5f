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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
    "MetricSetting",
    "MetricSpec",
    "RealSideCache",
    "RunValue",
    "SweepColumn",
    "default_metrics",
    "get_metric",
    "metric_names",
    "register_metric",
    "resolve_metric_name",
    "settings_problem",
    "sweep_metrics",
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
class MetricSetting:
    """An evaluation setting that only this metric reads: a field of
    :class:`~dplang.evaluation.context.EvaluationSettings`, flag ``--NAME`` (``_`` → ``-``).
    Given without the metric it is refused; ``required``: the metric refuses to run without
    it (``help`` says what to give)."""

    name: str
    help: str
    required: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class SweepColumn:
    """A column of an experiment sweep's ``results.csv``: the value at ``path`` in the
    metric's entry of the cell's run (``runs[0][metric]`` of ``metrics.json``), or with
    ``real=True`` in the real texts' entry (``real[metric]``)."""

    name: str
    path: Path_
    real: bool = False

    def value(self, result: dict[str, Any], metric: str) -> Any:
        """The column's value in an evaluation ``result`` (``None`` where it is missing)."""
        entry = result.get("real") if self.real else (result.get("runs") or [{}])[0]
        return lookup(entry, (metric, *self.path))


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
    ``default``: part of the metrics computed when none are named; ``help``: a few words on
    what an opt-in metric measures, for ``--metrics``' help.

    What the front ends read, so that none of them names a metric: ``settings``, the
    evaluation settings only this metric reads (refused without it; :func:`settings_problem`);
    ``summary(entry)``, its part of ``dplang evaluate``'s line for one run (default: every
    aggregate value as ``key=value``); ``footer(result, out_dir)``, lines ``dplang evaluate``
    prints after the runs. For experiment sweeps (:mod:`dplang.experiments`):
    ``sweep_default`` (computed when the config names no metrics; ``None``: as ``default``),
    ``sweep_columns`` (its columns of ``results.csv``; default: one per aggregate value) and
    ``uses_model`` (it computes with the scoring model's weights, not only its tokenizer: a
    sweep loads the model once for all its cells and records it in each cell's evaluation
    settings)."""

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
    settings: tuple[MetricSetting, ...] = ()
    summary: Callable[[dict[str, Any]], Sequence[str]] | None = None
    footer: Callable[[dict[str, Any], Path], Sequence[str]] | None = None
    sweep_default: bool | None = None
    sweep_columns: tuple[SweepColumn, ...] | None = None
    uses_model: bool = False
    help: str = ""

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

    def run_summary(self, entry: dict[str, Any]) -> list[str]:
        """Its parts of ``dplang evaluate``'s line for one run (``entry``: the run's entry of
        this metric)."""
        if self.summary is not None:
            return list(self.summary(entry))
        parts = []
        for value in self.ordered_values():
            number = value.value(entry)
            if isinstance(number, int | float):
                parts.append(f"{value.key}={number * value.scale:.{value.digits}f}")
        return parts

    def results_columns(self) -> tuple[SweepColumn, ...]:
        """Its columns of an experiment sweep's ``results.csv``."""
        if self.sweep_columns is not None:
            return self.sweep_columns
        return tuple(SweepColumn(v.key, v.path) for v in self.ordered_values())

    @property
    def in_sweeps_by_default(self) -> bool:
        return self.default if self.sweep_default is None else self.sweep_default


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
    taken = {c.name for s in _METRICS.values() if s.name != name for c in s.results_columns()}
    clash = [c.name for c in spec.results_columns() if c.name in taken]
    if clash:
        raise ValueError(f"results column {clash[0]!r} already belongs to another metric")
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
                                     "dplang.evaluation.downstream",
                                     "dplang.evaluation.twosample")
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


def sweep_metrics() -> tuple[str, ...]:
    """The metrics an experiment sweep computes when its config names none."""
    return tuple(name for name in metric_names() if _METRICS[name].in_sweeps_by_default)


def settings_problem(names: Sequence[str] | None, given: Mapping[str, Any],
                     *, required: bool = True) -> str | None:
    """A one-line usage error, or ``None``: a metric's own setting given (a value other than
    ``None`` in ``given``) without the metric, or, with ``required``, a chosen metric without
    a setting it requires. ``names``: the chosen metrics, as given (aliases and unknown names
    allowed: those are the parser's to refuse); ``None`` means the default metrics."""
    chosen = {resolve_metric_name(n) for n in names} if names is not None \
        else set(default_metrics())
    for name in metric_names():
        spec = _METRICS[name]
        if name not in chosen and any(given.get(s.name) is not None for s in spec.settings):
            flags = " and ".join(s.flag for s in spec.settings)
            verb = "are" if len(spec.settings) > 1 else "is"
            return f"{flags} {verb} for --metrics {name}"
        if name in chosen and required:
            for setting in spec.settings:
                if setting.required and given.get(setting.name) is None:
                    return f"--metrics {name} needs {setting.flag} ({setting.help})"
    return None
