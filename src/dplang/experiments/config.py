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
prompt = "yelp_review.toml" # built-in name or a TOML template (relative to this file)

[generation]
model = "default"
max_tokens = 64
num = 100                   # generations per cell
delta = 1e-6
concurrent_groups = 8
dtype = "float32"           # model body of the generation cells: float32, bfloat16 or auto
augpe_iterations = 3        # Aug-PE: T noisy histograms, L variations per text and iteration
augpe_variations = 7

[sweep]                     # the cartesian product of these lists
methods = ["invisibleink"]
epsilon = [1, 3, 5, 10]
batch_size = [7]            # or per method: batch_size = { invisibleink = [3, 7], amin = [15] }
top_k = [10, 50, 100]
temperature = [1.2]
replicates = 1              # independent cells per point, each with a fresh SECRET seed
# seeds = [0]               # instead: seeds written here, NOT secret: toy or public data only
public_baseline = true      # add the public-only cell (ε = 0, no references)

[evaluation]
metrics = ["mauve", "length", "topk"]   # and "perplexity" (ΔPPL against the real texts)
embedder = "default"
num_buckets = 5             # optional; MAUVE buckets (default max(2, n // 20))
```

Row ranges are positions in the data file, so the split into references and held-out texts is
data-independent. Every cell is a release: it is charged to the user's privacy ledger (CLI
``--ledger``, default ``$DPLANG_LEDGER`` or the user data directory) under the dataset's name
(``[data].dataset``, CLI ``--dataset``; default the data file's resolved path), so a sweep over
hyperparameters on private data costs the sequential composition of its cells against the same
budget as every other release of that data, and ``results.md`` reports that total.

Seeds. By default (``replicates = N``) every private cell draws a fresh secret seed from the
operating system, kept in the cell's private side file ``cells/<key>/gen.private.json`` (mode
600) so that an interrupted cell resumes. A seed written in the configuration (``seeds = [...]``)
is not secret — whoever reads the config can invert the sampler — so written seeds are for toy or
public data only (reproducing a paper on a public benchmark); ``results.md`` then says that the
cells carry no privacy guarantee.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..models.dtypes import DTYPES

METHODS = ("invisibleink", "amin", "adapmixed", "augpe", "public")


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


def calls_per_token(cell: Cell, config: ExperimentConfig) -> int:
    """Model calls per generated token of ``cell``: B + 1 for InvisibleInk, Amin et al. and
    AdaPMixED (every row of a group is decoded at every step), 1 for public generation, and
    1 + L·T for Aug-PE (each final text is one of n samples, and each of T iterations
    generates L variations of every sample)."""
    if cell.method == "augpe":
        return 1 + config.augpe_variations * config.augpe_iterations
    return 1 if cell.method == "public" else cell.batch_size + 1


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
    dtype: str = "float32"
    augpe_iterations: int = 3
    augpe_variations: int = 7
    #: MAUVE k-means buckets (None: the paper's max(2, n // 20)).
    num_buckets: int | None = None
    #: Ledger name of the data (None: the data file's resolved path).
    dataset: str | None = None
    #: True when the cells use seeds written in the config (not secret: toy/public data only).
    written_seeds: bool = False


def _range(value: Any, what: str) -> tuple[int, int]:
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, int) for v in value) or not 0 <= value[0] < value[1]):
        raise ConfigError(f"[data].{what} must be [start, stop) with 0 <= start < stop")
    return value[0], value[1]


def _list(section: dict[str, Any], key: str, kind: type, default: Any = None) -> list[Any]:
    value = section.get(key, default)
    if value is None:
        raise ConfigError(f"[sweep].{key} is required")
    if not isinstance(value, list):
        value = [value]
    try:
        return [kind(v) for v in value]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[sweep].{key}: {exc}") from exc


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment TOML file."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config not found: {path}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    base = path.resolve().parent
    data = raw.get("data", {})
    gen = raw.get("generation", {})
    sweep = raw.get("sweep", {})
    ev = raw.get("evaluation", {})
    if "path" not in data:
        raise ConfigError("[data].path is required")
    data_path = (base / data["path"]).resolve()
    refs = _range(data.get("references"), "references")
    real = _range(data.get("real"), "real")
    if refs[0] < real[1] and real[0] < refs[1]:
        raise ConfigError("[data].references and [data].real overlap: held-out texts must "
                          "never be references")
    prompt = str(data.get("prompt", "yelp"))
    if prompt.endswith(".toml"):
        prompt = str((base / prompt).resolve())
    methods = _list(sweep, "methods", str, ["invisibleink"])
    for m in methods:
        if m not in METHODS:
            raise ConfigError(f"unknown method {m!r}; known: {', '.join(METHODS)}")
    eps = _list(sweep, "epsilon", float)
    raw_bs = sweep.get("batch_size")
    if isinstance(raw_bs, dict):  # per-method batch sizes (e.g. the compute comparison)
        unknown = sorted(set(raw_bs) - set(methods))
        if unknown:
            raise ConfigError(f"[sweep].batch_size names methods not in [sweep].methods: "
                              f"{', '.join(unknown)}")
        missing = [m for m in methods if m not in raw_bs]
        if missing:
            raise ConfigError(f"[sweep].batch_size has no entry for {', '.join(missing)}")
        bs_of = {m: _list(raw_bs, m, int) for m in methods}
    else:
        shared = _list(sweep, "batch_size", int)
        bs_of = {m: shared for m in methods}
    bs = [b for m in methods for b in bs_of[m]]
    ks = _list(sweep, "top_k", int, [50])
    taus = _list(sweep, "temperature", float, [1.2])
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
        if not isinstance(replicates, int) or replicates < 1:
            raise ConfigError("[sweep].replicates must be an integer >= 1")
        points = [(None, i) for i in range(replicates)]
    if any(e <= 0 for e in eps) or any(b < 1 for b in bs) or any(k < 0 for k in ks) \
            or any(t <= 0 for t in taus):
        raise ConfigError("[sweep]: epsilon > 0, batch_size >= 1, top_k >= 0, temperature > 0")
    cells = [Cell(m, e, b, k, t, s, r)
             for m in methods
             for e, b, k, t, (s, r) in itertools.product(eps, bs_of[m], ks, taus, points)]
    if sweep.get("public_baseline", False):
        cells += [Cell("public", 0.0, 0, k, t, s, r)
                  for k, t, (s, r) in itertools.product(sorted(set(ks)), taus, points)]
    dataset = data.get("dataset")
    if dataset is not None and (not isinstance(dataset, str) or not dataset.strip()):
        raise ConfigError("[data].dataset must be a non-empty name")
    num = int(gen.get("num", 100))
    if num < 1:
        raise ConfigError("[generation].num must be >= 1")
    dtype = str(gen.get("dtype", "float32"))
    if dtype not in DTYPES:
        raise ConfigError(f"[generation].dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    buckets = ev.get("num_buckets")
    if buckets is not None and (not isinstance(buckets, int) or buckets < 2):
        raise ConfigError("[evaluation].num_buckets must be an integer >= 2")
    augpe_t = int(gen.get("augpe_iterations", 3))
    augpe_l = int(gen.get("augpe_variations", 7))
    if augpe_t < 1 or augpe_l < 0:
        raise ConfigError("[generation]: augpe_iterations >= 1 and augpe_variations >= 0")
    return ExperimentConfig(
        name=str(raw.get("name", path.stem)), base_dir=base, data_path=data_path,
        text_column=str(data.get("text_column", "text")), references=refs, real=real,
        group_by=tuple(data.get("group_by", [])), prompt=prompt,
        model=str(gen.get("model", "default")), max_tokens=int(gen.get("max_tokens", 64)),
        num=num, delta=float(gen.get("delta", 1e-6)),
        concurrent_groups=int(gen.get("concurrent_groups", 8)), cells=tuple(cells),
        metrics=tuple(ev.get("metrics", ["mauve", "length", "topk"])),
        embedder=str(ev.get("embedder", "default")), raw=raw, dtype=dtype,
        augpe_iterations=augpe_t, augpe_variations=augpe_l, num_buckets=buckets,
        dataset=dataset.strip() if dataset else None, written_seeds="seeds" in sweep,
    )
