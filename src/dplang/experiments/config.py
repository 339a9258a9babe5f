"""Experiment configuration: a TOML file describing a sweep of generation cells.

```toml
name = "yelp-table12"

[data]
path = "../../shared/data/yelp/dev.csv"   # relative to this file
dataset = "yelp-dev"        # ledger name of the data's budget (default: the file's resolved path)
text_column = "text"
references = [0, 4000]      # rows [start, stop) used as private references
real = [4000, 5000]         # held-out real rows for evaluation (disjoint from references)
group_by = []               # public label columns (optional)
batch_order = "grouped"     # with group_by: "interleaved" takes every group in proportion
prompt = "yelp_review.toml" # built-in name or a TOML template (relative to this file)

[generation]
model = "default"
max_tokens = 64
num = 100                   # generations per cell
delta = 1e-6
concurrent_groups = 8
dtype = "bfloat16"          # model precision of the generation cells: bfloat16, float32 or auto
threads = 2                 # optional: CPU threads (speed only; default every core)
augpe_iterations = 3        # a method's options, as <method>_<option> (those its spec lets a
augpe_variations = 7        # sweep set): Aug-PE's T noisy histograms and L variations

[sweep]                     # the cartesian product of these lists
methods = ["invisibleink"]  # a registered method, e.g. "nonprivate" (NOT private: ε = ∞)
epsilon = [1, 3, 5, 10]     # or per method: epsilon = { invisibleink = [1, 10], amin = [10] }
batch_size = [7]            # or per method: batch_size = { invisibleink = [3, 7], amin = [15] }
                            # or per method and ε: { invisibleink = { "1" = [7], "10" = [15] } }
top_k = [10, 50, 100]
temperature = [1.2]
replicates = 1              # independent cells per point, each with a fresh SECRET seed
# seeds = [0]               # instead: seeds written here, NOT secret: toy or public data only
public_baseline = true      # add the public-only cell (ε = 0, no references)

[evaluation]
metrics = ["mauve", "length", "topk"]   # registered metrics (dplang.evaluation.registry; this
                                        # is the default), e.g. "perplexity" (ΔPPL against the
                                        # real texts), "downstream" (train on synthetic, test
                                        # on real), "classifier" (two-sample AUC), "labels"
                                        # (label-mix TVD)
mauve_bootstrap = 0         # optional; MAUVE interval over this many resampled text sets
# real_max_tokens = 64      # optional; cut the real texts to T tokens (like the generations)
embedder = "default"
num_buckets = 5             # optional; MAUVE buckets (default max(2, n // 20))
# label_column = "label1"   # downstream only, and required there: a [data].group_by column
```

With ``downstream`` each cell's classifier trains on its ``num`` generations (labelled with
the group each was generated for), the ceiling on the first ``num`` held-out rows, and all the
later held-out rows are the test set, so ``[data].real`` must hold more than ``num`` rows.

Row ranges are positions in the data file, so the split into references and held-out texts is
data-independent. Every cell is a release: it is charged to the user's privacy ledger (CLI
``--ledger``, default ``$DPLANG_LEDGER`` or the user data directory) under the dataset's name
(``[data].dataset``, CLI ``--dataset``; default the data file's resolved path), so a sweep over
hyperparameters on private data costs the sequential composition of its cells against the same
budget as every other release of that data, and ``results.md`` reports that total.

Seeds. By default (``replicates = N``) every private cell draws a fresh secret seed from the
operating system, kept in the cell's private side file
``cells/<key>/.dplang-private/gen.private.json`` (mode 600) so that an interrupted cell
resumes. A seed written in the configuration (``seeds = [...]``) is not secret — whoever
reads the config can invert the sampler — so written seeds are for toy or public data only
(reproducing a paper on a public benchmark); such cells are toy runs: ``results.md``, their
public manifests and the ledger say that they carry no privacy guarantee.
"""

from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..evaluation.registry import get_metric, metric_names, sweep_metrics
from ..models.dtypes import DTYPES
from ..privacy.accounting import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    BudgetLimitError,
    check_budget_limit,
)
from ..textgen.prompts import DEFAULT_MAX_REFERENCE_TOKENS, DEFAULT_TEMPLATE

if TYPE_CHECKING:
    from ..textgen.methods.registry import MethodOption

#: Besides the registered generation methods (dplang.textgen.methods): public-only generation.
PUBLIC = "public"


def known_methods() -> tuple[str, ...]:
    """The methods a sweep may name: every registered one, and ``public``."""
    from ..textgen.methods import method_names

    return (*method_names(), PUBLIC)


class ConfigError(ValueError):
    """A bad experiment configuration (one-line message)."""


@dataclass(frozen=True)
class Cell:
    """One point of the sweep: ``seed`` is a seed written in the configuration (not secret;
    toy or public data only) or None (a fresh secret seed per cell); ``replicate`` numbers the
    independent cells of one point."""

    method: str
    epsilon: float
    batch_size: int
    top_k: int
    temperature: float
    seed: int | None
    replicate: int = 0

    @property
    def key(self) -> str:
        tail = f"s{self.seed}" if self.seed is not None else f"r{self.replicate}"
        if self.method == "public":
            return f"public_k{self.top_k}_t{self.temperature:g}_{tail}"
        return (f"{self.method}_eps{self.epsilon:g}_B{self.batch_size}_k{self.top_k}"
                f"_t{self.temperature:g}_{tail}")


def method_options(cell: Cell, config: ExperimentConfig) -> dict[str, Any]:
    """The options the config sets for a cell's method (``[generation].<method>_<option>``,
    for the options whose spec lets a sweep set them: ``MethodOption.in_sweeps``); its other
    options take their defaults."""
    return dict(config.method_options.get(cell.method, {}))


def sweep_options() -> dict[str, tuple[str, MethodOption]]:
    """``{[generation] key: (method, MethodOption)}``: the options of the registered methods
    that an experiment config may set, as ``<method>_<option>``."""
    from ..textgen.methods import all_methods

    return {f"{spec.name}_{opt.name}": (spec.name, opt)
            for spec in all_methods() for opt in spec.options if opt.in_sweeps}


def calls_per_token(cell: Cell, config: ExperimentConfig) -> int:
    """Model calls per generated token of ``cell``, as its method's spec states them: B + 1
    for InvisibleInk, Amin et al. and AdaPMixED (every row of a group is decoded at every
    step), 1 + L·T for Aug-PE (each final text is one of n samples, and each of T iterations
    generates L variations of every sample), and 1 for public generation."""
    if cell.method == PUBLIC:
        return 1
    from ..textgen.methods import get_method

    spec = get_method(cell.method)
    return spec.calls_per_token(cell.batch_size,
                                spec.resolve_options(method_options(cell, config)))


@dataclass(frozen=True)
class ExperimentConfig:
    name: str
    base_dir: Path
    data_path: Path
    text_column: str
    references: tuple[int, int]
    real: tuple[int, int]
    group_by: tuple[str, ...]
    prompt: str
    model: str
    max_tokens: int
    num: int
    delta: float
    concurrent_groups: int
    cells: tuple[Cell, ...]
    metrics: tuple[str, ...]
    embedder: str
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    #: Model body dtype of every generation cell (evaluation always scores in float32).
    dtype: str = "bfloat16"
    #: CPU threads of the models (None: $DPLANG_THREADS, $OMP_NUM_THREADS or every core);
    #: speed only, never a bit of a result, so not part of a cell's identity.
    threads: int | None = None
    #: ``{method: {option: value}}`` for the methods whose options a sweep may set
    #: (:func:`sweep_options`), defaults included.
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: MAUVE k-means buckets (None: the paper's max(2, n // 20)).
    num_buckets: int | None = None
    #: Ledger name of the data (None: the data file's resolved path).
    dataset: str | None = None
    #: True when the cells use seeds written in the config (not secret: toy/public data only).
    written_seeds: bool = False
    #: References are cut to their first this-many model tokens (as ``generate``'s flag).
    max_reference_tokens: int = 256
    #: Where ``[data].path`` was looked for (see :func:`resolve_data_path`).
    data_candidates: tuple[Path, ...] = ()
    #: The public label column of the ``downstream`` metric (one of ``group_by``).
    label_column: str | None = None
    #: MAUVE's interval over resampled texts: bootstrap resamples per cell (0: none).
    mauve_bootstrap: int = 0
    #: Held-out real texts are cut to their first this-many tokens before every metric.
    real_max_tokens: int | None = None
    #: With ``group_by``: which batches the first ``num`` are ("grouped": the first groups;
    #: "interleaved": every group in proportion; dplang.textgen.batching).
    batch_order: str = "grouped"


#: The keys each section may hold; anything else is refused with its name (a misspelt key
#: would otherwise be ignored and the sweep would run with the default it meant to change).
KEYS: dict[str, frozenset[str]] = {
    "": frozenset({"name", "data", "generation", "sweep", "evaluation"}),
    "data": frozenset({"path", "dataset", "text_column", "references", "real", "group_by",
                       "prompt", "batch_order"}),
    "generation": frozenset({"model", "max_tokens", "num", "delta", "concurrent_groups",
                             "dtype", "threads", "max_reference_tokens"}),
    "sweep": frozenset({"methods", "epsilon", "batch_size", "top_k", "temperature",
                        "replicates", "seeds", "public_baseline"}),
    "evaluation": frozenset({"metrics", "embedder", "num_buckets", "label_column",
                             "mauve_bootstrap", "real_max_tokens"}),
}


def _check_keys(raw: dict[str, Any]) -> None:
    # besides its own keys, [generation] holds the options the methods let a sweep set
    keys = {**KEYS, "generation": KEYS["generation"] | set(sweep_options())}
    for section, allowed in keys.items():
        table = raw if not section else raw.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"[{section}] must be a table")
        for key in table:
            if key not in allowed:
                where = f"[{section}].{key}" if section else key
                raise ConfigError(f"unknown key {where}; allowed"
                                  + (f" in [{section}]" if section else " at the top") + ": "
                                  + ", ".join(sorted(allowed)))


def _range(value: Any, what: str) -> tuple[int, int]:
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or not 0 <= value[0] < value[1]):
        raise ConfigError(f"[data].{what} must be [start, stop) with 0 <= start < stop")
    return value[0], value[1]


def _int(section: dict[str, Any], name: str, key: str, default: int, low: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"[{name}].{key} must be an integer >= {low}, got {value!r}")
    return value


def _str(section: dict[str, Any], name: str, key: str, default: str) -> str:
    value = section.get(key, default)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"[{name}].{key} must be a non-empty string, got {value!r}")
    return value


def _list(section: dict[str, Any], key: str, kind: type, default: Any = None) -> list[Any]:
    value = section.get(key, default)
    if value is None:
        raise ConfigError(f"[sweep].{key} is required")
    if not isinstance(value, list):
        value = [value]
    if not value:
        raise ConfigError(f"[sweep].{key} must not be empty")
    out = []
    for v in value:
        if isinstance(v, bool) or (kind is int and not isinstance(v, int)) or (
                kind is float and not isinstance(v, int | float)) or (
                kind is str and not isinstance(v, str)):
            what = {float: "a number", int: "an integer"}.get(kind, "a string")
            raise ConfigError(f"[sweep].{key}: {v!r} is not {what}")
        out.append(kind(v))
    return out


def project_root(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` holding ``pyproject.toml`` or ``.git``."""
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").exists() or (folder / ".git").exists():
            return folder
    return None


def resolve_data_path(value: str, base: Path) -> tuple[Path, list[Path]]:
    """``[data].path`` → (path, the places looked at). An absolute path is taken as is; a
    relative one is looked up relative to the config file's folder, then relative to the
    project root (the nearest folder above it with ``pyproject.toml`` or ``.git``), so a config
    inside a repository can name data the way the project's docs do
    (``../shared/data/yelp/dev.csv`` from the repository root) and runs from any clone. The
    first candidate that exists wins; when none does, the first is returned."""
    raw = Path(value).expanduser()
    if raw.is_absolute():
        return raw, [raw]
    candidates = [(base / raw).resolve()]
    root = project_root(base)
    if root is not None and (root / raw).resolve() not in candidates:
        candidates.append((root / raw).resolve())
    for c in candidates:
        if c.exists():
            return c, candidates
    return candidates[0], candidates


def load_config(path: str | Path, data: str | Path | None = None) -> ExperimentConfig:
    """Read and validate an experiment TOML file (every key, type and range; unknown keys
    are refused by name). ``data`` overrides ``[data].path`` (CLI ``--data``)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config not found: {path}")
    if path.is_dir():
        raise ConfigError(f"config {path} is a folder, not a TOML file")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"config {path} cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    _check_keys(raw)
    base = path.resolve().parent
    data_section = raw.get("data", {})
    gen = raw.get("generation", {})
    sweep = raw.get("sweep", {})
    ev = raw.get("evaluation", {})
    if data is not None:
        data_path, looked = Path(data).expanduser().resolve(), [Path(data)]
    else:
        if "path" not in data_section:
            raise ConfigError("[data].path is required (or give --data)")
        data_path, looked = resolve_data_path(_str(data_section, "data", "path", ""), base)
    refs = _range(data_section.get("references"), "references")
    real = _range(data_section.get("real"), "real")
    if refs[0] < real[1] and real[0] < refs[1]:
        raise ConfigError("[data].references and [data].real overlap: held-out texts must "
                          "never be references")
    prompt = _str(data_section, "data", "prompt", DEFAULT_TEMPLATE)
    if prompt.endswith(".toml"):
        prompt = str((base / prompt).resolve())
    group_by = data_section.get("group_by", [])
    if not isinstance(group_by, list) or not all(isinstance(c, str) and c for c in group_by):
        raise ConfigError("[data].group_by must be a list of column names")
    from ..textgen.batching import BATCH_ORDERS

    batch_order = data_section.get("batch_order", "grouped")
    if batch_order not in BATCH_ORDERS:
        raise ConfigError(f"[data].batch_order must be one of {', '.join(BATCH_ORDERS)}, got "
                          f"{batch_order!r}")
    baseline = sweep.get("public_baseline", False)
    if not isinstance(baseline, bool):
        raise ConfigError("[sweep].public_baseline must be true or false")
    if sweep.get("methods") == [] and baseline:
        methods: list[str] = []  # the public-only cell alone
    else:
        methods = _list(sweep, "methods", str, ["invisibleink"])
    for m in methods:
        if m not in known_methods():
            raise ConfigError(f"unknown method {m!r}; known: {', '.join(known_methods())}")
    eps_of = _epsilons(sweep, methods)
    bs_of = _batch_sizes(sweep, methods, eps_of)
    bs = [b for values in bs_of.values() for b in values]
    ks = _list(sweep, "top_k", int, [50])
    taus = _list(sweep, "temperature", float, [DEFAULT_TEMPERATURE])
    if "seeds" in sweep:
        if "replicates" in sweep:
            raise ConfigError("[sweep]: give seeds (written, not secret) or replicates (secret "
                              "seeds), not both")
        points: list[tuple[int | None, int]] = [
            (s, i) for i, s in enumerate(_list(sweep, "seeds", int))]
        if any(s < 0 for s, _ in points):
            raise ConfigError("[sweep].seeds must be >= 0")
    else:
        replicates = sweep.get("replicates", 1)
        if isinstance(replicates, bool) or not isinstance(replicates, int) or replicates < 1:
            raise ConfigError("[sweep].replicates must be an integer >= 1")
        points = [(None, i) for i in range(replicates)]
    if any(b < 1 for b in bs) or any(k < 0 for k in ks) \
            or any(not (math.isfinite(t) and t > 0) for t in taus):
        raise ConfigError("[sweep]: batch_size >= 1, top_k >= 0, temperature finite and > 0")
    cells = [Cell(m, e, b, k, t, s, r)
             for m in methods for e in eps_of[m]
             for b, k, t, (s, r) in itertools.product(bs_of[(m, e)], ks, taus, points)]
    if baseline:
        cells += [Cell("public", 0.0, 0, k, t, s, r)
                  for k, t, (s, r) in itertools.product(sorted(set(ks)), taus, points)]
    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        raise ConfigError("[sweep] lists a value twice (two cells would share a directory)")
    dataset = data_section.get("dataset")
    if dataset is not None and (not isinstance(dataset, str) or not dataset.strip()):
        raise ConfigError("[data].dataset must be a non-empty name")
    num = _int(gen, "generation", "num", 100, 1)
    delta = gen.get("delta", 1e-6)
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < delta < 1:
        raise ConfigError(f"[generation].delta must be in (0, 1), got {delta!r}")
    threads = gen.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ConfigError(f"[generation].threads must be an integer >= 1, got {threads!r}")
    dtype = _str(gen, "generation", "dtype", "bfloat16")
    if dtype not in DTYPES:
        raise ConfigError(f"[generation].dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    buckets = ev.get("num_buckets")
    if buckets is not None and (isinstance(buckets, bool) or not isinstance(buckets, int)
                                or buckets < 2):
        raise ConfigError("[evaluation].num_buckets must be an integer >= 2")
    options: dict[str, dict[str, Any]] = {}
    for key, (method, opt) in sweep_options().items():
        options.setdefault(method, {})[opt.name] = _option(gen, key, method, opt)
    metrics = ev.get("metrics", list(sweep_metrics()))
    known = metric_names()
    if not isinstance(metrics, list) or not metrics or any(m not in known for m in metrics):
        raise ConfigError(f"[evaluation].metrics must be a non-empty list of "
                          f"{', '.join(known)}; got {metrics!r}")
    label_column = _label_column(ev, metrics, tuple(group_by), real, num)
    mauve_bootstrap = _int(ev, "evaluation", "mauve_bootstrap", 0, 0)
    if mauve_bootstrap:
        owner = _setting_owner(metrics, "mauve_bootstrap")
        if mauve_bootstrap < 2:
            raise ConfigError(f"[evaluation].mauve_bootstrap is 0 (no interval) or at least 2 "
                              f"resamples of the {owner} metric; got {mauve_bootstrap}")
    return ExperimentConfig(
        name=_str(raw, "", "name", path.stem) if "name" in raw else path.stem,
        base_dir=base, data_path=data_path,
        text_column=_str(data_section, "data", "text_column", "text"), references=refs,
        real=real, group_by=tuple(group_by), prompt=prompt,
        model=_str(gen, "generation", "model", "default"),
        max_tokens=_int(gen, "generation", "max_tokens", DEFAULT_MAX_TOKENS, 1),
        num=num, delta=float(delta),
        concurrent_groups=_int(gen, "generation", "concurrent_groups", 8, 1),
        cells=tuple(cells), metrics=tuple(metrics),
        embedder=_str(ev, "evaluation", "embedder", "default"), raw=raw, dtype=dtype,
        threads=threads,
        method_options=options, num_buckets=buckets,
        dataset=dataset.strip() if dataset else None, written_seeds="seeds" in sweep,
        max_reference_tokens=_int(gen, "generation", "max_reference_tokens",
                                  DEFAULT_MAX_REFERENCE_TOKENS, 1),
        data_candidates=tuple(looked), label_column=label_column,
        mauve_bootstrap=mauve_bootstrap, batch_order=batch_order,
        real_max_tokens=(None if ev.get("real_max_tokens") is None
                         else _int(ev, "evaluation", "real_max_tokens", 0, 1)),
    )


def takes_budget(method: str) -> bool:
    """Whether a method takes a privacy budget (its spec's ``takes_budget``); one that takes
    none (``nonprivate``, a non-private ceiling) gets one cell per point, with ε = ∞ in its key
    and results."""
    if method == PUBLIC:
        return False
    from ..textgen.methods import get_method

    return get_method(method).takes_budget


def _epsilons(sweep: dict[str, Any], methods: list[str]) -> dict[str, list[float]]:
    """``[sweep].epsilon``: one list for every method, or a table of lists per method
    (``epsilon = { invisibleink = [1, 3, 10], augpe = [3, 10] }``). A method that takes no
    budget gets ε = ∞ (and may not be given one in a table)."""
    if not methods:
        return {}
    free = [m for m in methods if not takes_budget(m)]
    raw = sweep.get("epsilon")
    if isinstance(raw, dict):
        unknown = sorted(set(raw) - set(methods))
        if unknown:
            raise ConfigError(f"[sweep].epsilon names methods not in [sweep].methods: "
                              f"{', '.join(unknown)}")
        given = [m for m in free if m in raw]
        if given:
            raise ConfigError(f"[sweep].epsilon: {', '.join(given)} takes no privacy budget "
                              "(it is not private); leave it out of the table")
        missing = [m for m in methods if m not in raw and m not in free]
        if missing:
            raise ConfigError(f"[sweep].epsilon has no entry for {', '.join(missing)}")
        eps_of = {m: _list(raw, m, float) for m in methods if m not in free}
    elif free and len(free) == len(methods) and raw is None:
        eps_of = {}
    else:
        shared = _list(sweep, "epsilon", float)
        eps_of = {m: shared for m in methods if m not in free}
    for m in free:
        eps_of[m] = [math.inf]
    for m, values in eps_of.items():
        if len(set(values)) != len(values):
            raise ConfigError(f"[sweep].epsilon lists a value twice for {m}")
        for e in values:
            if math.isinf(e) and m in free:
                continue
            try:
                check_budget_limit(e, name="[sweep].epsilon")
            except BudgetLimitError as exc:
                raise ConfigError(str(exc)) from None
    return eps_of


def _batch_sizes(sweep: dict[str, Any], methods: list[str], eps_of: dict[str, list[float]]
                 ) -> dict[tuple[str, float], list[int]]:
    """``[sweep].batch_size`` per (method, ε): one list for all, a table of lists per method
    (``{ invisibleink = [3, 7], amin = [15] }``), or per method a table of lists per ε, its
    keys the ε values as strings (``invisibleink = { "1" = [7], "3" = [15], "10" = [15] }``:
    B chosen per ε, as the InvisibleInk paper does); such a table must name every ε of the
    method and only those."""
    raw = sweep.get("batch_size")
    if not methods:
        return {}
    if not isinstance(raw, dict):
        shared = _list(sweep, "batch_size", int)
        return {(m, e): shared for m in methods for e in eps_of[m]}
    unknown = sorted(set(raw) - set(methods))
    if unknown:
        raise ConfigError(f"[sweep].batch_size names methods not in [sweep].methods: "
                          f"{', '.join(unknown)}")
    missing = [m for m in methods if m not in raw]
    if missing:
        raise ConfigError(f"[sweep].batch_size has no entry for {', '.join(missing)}")
    out: dict[tuple[str, float], list[int]] = {}
    for m in methods:
        value = raw[m]
        if not isinstance(value, dict):
            for e in eps_of[m]:
                out[(m, e)] = _list(raw, m, int)
            continue
        if not takes_budget(m):
            raise ConfigError(f"[sweep].batch_size.{m}: a method without a privacy budget "
                              "takes one list of batch sizes, not a table per ε")
        per_eps: dict[float, list[int]] = {}
        for key in value:
            try:
                e = float(key)
            except ValueError:
                raise ConfigError(f"[sweep].batch_size.{m}: {key!r} is not an ε") from None
            per_eps[e] = _list(value, key, int)
        if sorted(per_eps) != sorted(eps_of[m]):
            raise ConfigError(f"[sweep].batch_size.{m} gives batch sizes for ε = "
                              f"{', '.join(f'{e:g}' for e in sorted(per_eps))} but "
                              f"[sweep].epsilon lists "
                              f"{', '.join(f'{e:g}' for e in sorted(eps_of[m]))} for it")
        for e in eps_of[m]:
            out[(m, e)] = per_eps[e]
    return out


def _option(gen: dict[str, Any], key: str, method: str, opt: MethodOption) -> Any:
    """``[generation].<method>_<option>``: of the option's type exactly (no bool for a number,
    no float for an integer), then checked as the method's spec checks it."""
    value = gen.get(key, opt.default)
    if opt.type is bool:
        fits = isinstance(value, bool)
    else:
        kinds = {int: int, float: int | float}.get(opt.type, opt.type)
        fits = not isinstance(value, bool) and isinstance(value, kinds)
    if not fits:
        what = {int: "an integer", float: "a number", bool: "true or false"}.get(opt.type,
                                                                               "a string")
        raise ConfigError(f"[generation].{key} must be {what}, got {value!r}")
    try:
        return opt.parse(method, value)
    except ValueError as exc:
        raise ConfigError(str(exc).replace(opt.flag(method), f"[generation].{key}")) from None


def _owners(setting: str) -> list[str]:
    """The registered metrics whose spec reads the evaluation setting ``setting``."""
    return [m for m in metric_names()
            if any(s.name == setting for s in get_metric(m).settings)]


def _setting_owner(metrics: list[str], setting: str) -> str:
    """The configured metric that reads ``[evaluation].<setting>`` (the registry says which);
    ``ConfigError`` when none of the configured metrics does."""
    owners = _owners(setting)
    chosen = [m for m in metrics if m in owners]
    if not chosen:
        raise ConfigError(f"[evaluation].{setting} is for the {' or '.join(owners)} metric; "
                          f"add \"{owners[0]}\" to [evaluation].metrics or remove it")
    return chosen[0]


def _label_column(ev: dict[str, Any], metrics: list[str], group_by: tuple[str, ...],
                  real: tuple[int, int], num: int) -> str | None:
    """``[evaluation].label_column``: required by, and only allowed with, a metric that reads
    it (the registry says which: ``downstream``); a ``[data].group_by`` column (the only labels
    the generations carry, public by declaration); and the held-out rows must hold the
    ceiling's ``num`` plus a test set."""
    value = ev.get("label_column")
    if not any(m in _owners("label_column") for m in metrics):
        if value is not None:
            _setting_owner(metrics, "label_column")  # refuses it, naming its metric
        return None
    owner = _setting_owner(metrics, "label_column")
    if value is None:
        raise ConfigError(f"[evaluation].label_column is required by the {owner} metric "
                          "(a [data].group_by column)")
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"[evaluation].label_column must be a column name, got {value!r}")
    if value not in group_by:
        raise ConfigError(f"[evaluation].label_column {value!r} is not a [data].group_by "
                          "column: generations carry only the labels they were grouped by")
    if real[1] - real[0] <= num:
        raise ConfigError(f"[data].real holds {real[1] - real[0]} rows: {owner} needs more "
                          f"than [generation].num = {num} (the ceiling's training texts) plus "
                          "a test set")
    return value


def missing_data_message(config: ExperimentConfig) -> str | None:
    """A one-line error when the configuration's data file does not exist, else None."""
    if config.data_path.is_file():
        return None
    given = config.raw.get("data", {}).get("path", config.data_path)
    return (f"data file not found: {given} (looked in "
            + " and ".join(str(p) for p in config.data_candidates)
            + "); fix [data].path or give --data PATH")
