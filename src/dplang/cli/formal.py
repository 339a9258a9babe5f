"""``dplang formal``: the formal-language lab (papers 000 and 001 of ``docs/formal.md``).

(Over 500 lines on purpose: the lab's four subcommands share one parser of instances,
algorithms and their options; the lab itself is :mod:`dplang.formal`.)

``list`` the algorithms, instances and experiments; ``run`` one algorithm on a named instance
(simulation: errors with confidence intervals) or on ``--data`` (a real release, charged to the
ledger first); ``reproduce`` an experiment; ``audit`` an algorithm's privacy (exact when the
output space has at most 2^16 atoms, Monte Carlo otherwise; ``--exact``/``--monte-carlo``
force one; the method is printed with PASS/FAIL). Bad input: one line ``error: …``, exit code 2,
nothing written.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import typer

from ..privacy.ledger import BudgetExceeded
from ..release import ReleaseError
from .errors import fail
from .options import dataset_option, ledger_option, seed_option

app = typer.Typer(
    name="formal",
    help="Formal-language lab: private identification and generation of languages (papers "
    "000, 001: docs/formal.md).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)

# The algorithms, their paper numbers, settings and kinds: the formal lab's registry
# (dplang.formal.registry), read when a command runs.


def _algorithm_name(name: str) -> str:
    from ..formal.registry import algorithms_in, resolve_algorithm

    key = resolve_algorithm(name)
    if key is None:
        names = (*algorithms_in("statistical"), *algorithms_in("limit"),
                 *algorithms_in("statistical", "limit"))
        fail(f"unknown algorithm {name!r}; choose one of "
             f"{', '.join(names)} (or a paper number such as 000.3)")
    return key


def _statistical(name: str) -> bool:
    """Whether ``name`` runs in the statistical setting only (a sample: ``--n``)."""
    from ..formal.registry import get_algorithm

    return get_algorithm(name).settings == ("statistical",)


def _streaming(name: str) -> bool:
    """Whether ``name`` runs in the limit setting only (a stream: ``--horizon``)."""
    from ..formal.registry import get_algorithm

    return get_algorithm(name).settings == ("limit",)


def _instance(name: str, **params: Any) -> Any:
    from ..formal.truth import instance

    try:
        return instance(name, **params)
    except ValueError as exc:
        fail(str(exc).splitlines()[0])


def _positive(name: str, value: float | None, integer: bool = False) -> None:
    if value is None:
        return
    if integer and value < 1:
        fail(f"{name} must be >= 1, got {value}")
    if not integer and not (value > 0):
        fail(f"{name} must be > 0, got {value}")


def _tau(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        tau = float(text)
    except ValueError:
        fail(f"--tau {text!r}: tuning taken from the data is not allowed; give a number (τ "
             "must be a public function of n)")
    if not (tau > 0 and math.isfinite(tau)):
        fail(f"--tau must be > 0, got {text}")
    return tau


def _check_out(out: Path | None) -> None:
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        fail(f"{out} already exists; choose another --out")


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj


# ---------------------------------------------------------------------------------------------
# list
# ---------------------------------------------------------------------------------------------


@app.command("list")
def list_() -> None:
    """List the algorithms (with paper numbers), the named instances (with ground truth) and
    the experiments."""
    from ..formal.experiments import EXPERIMENTS
    from ..formal.registry import algorithm_names, get_algorithm
    from ..formal.truth import INSTANCES, instance

    typer.echo("Algorithms:")
    for name in algorithm_names():
        entry = get_algorithm(name)
        typer.echo(f"  {name:26s} {entry.paper:12s} {entry.task}")
    typer.echo("\nInstances:")
    for name in INSTANCES:
        inst = instance(name)
        typer.echo(f"  {inst.summary()}")
    typer.echo("\nExperiments:")
    for exp in EXPERIMENTS.values():
        typer.echo(f"  {exp.name:20s} {exp.paper:16s} {exp.title}")


# ---------------------------------------------------------------------------------------------
# building algorithms from options
# ---------------------------------------------------------------------------------------------


def _build(alg_name: str, inst: Any, n: int | None, epsilon: float | None,
           delta: float | None, k: int | None, tau: float | None, window: int | None,
           calibration: str, big_r: int | None, data_mode: bool) -> tuple[Any, dict[str, Any],
                                                                        list[str]]:
    from ..formal import limit, statistical
    from ..formal.registry import get_algorithm
    from ..formal.truth import generation_truth, identification_truth

    warnings: list[str] = []
    entry = get_algorithm(alg_name)
    if entry.private and epsilon is None:
        fail(f"--epsilon is required for {alg_name}")
    eps = epsilon if epsilon is not None else math.inf
    gaussian = entry.gaussian
    if calibration not in ("classical", "zcdp"):
        fail(f"--calibration must be classical or zcdp, got {calibration!r}")
    dlt = delta if delta is not None else 1e-6
    if gaussian and calibration == "classical" and not eps < 1:
        fail(f"the classical Gaussian calibration needs --epsilon < 1, got {eps:g}; use "
             "--calibration zcdp")
    params: dict[str, Any] = {"algorithm": alg_name, "epsilon": eps}
    if gaussian:
        params.update(delta=dlt, calibration=calibration)
    big_k = k if k is not None else inst.defaults.get("k", 2)
    if _statistical(alg_name):
        params["k"] = big_k
        dist = None if data_mode else inst.distribution
        if entry.task == "identification":
            if dist is not None and n is not None:
                t = identification_truth(inst.collection, dist, max(big_k, 16)
                                         if not inst.collection.is_finite
                                         else int(inst.collection.size or 1))
                theorem = entry.theorem
                if big_k < t.i_star:
                    warnings.append(f"k(n) = {big_k} < i* = {t.i_star}: {theorem} no longer "
                                    "applies")
                elif t.gap is not None and 1 / big_k > t.gap / 2:
                    warnings.append(f"1/k = {1 / big_k:.3g} > Δ/2 = {t.gap / 2:.3g}: "
                                    f"{theorem} no longer applies")
            kw: dict[str, Any] = {"k": big_k}
            if entry.private:
                kw["epsilon"] = eps
            if gaussian:
                kw.update(delta=dlt, calibration=calibration)
            return _make(entry.cls, kw), params, warnings
        # generation
        win = window if window is not None else inst.defaults.get("M", 3)
        params["window"] = win
        m_star = None
        rho = None
        if dist is not None:
            g = generation_truth(inst.collection, dist, max(big_k, 16)
                                 if not inst.collection.is_finite
                                 else int(inst.collection.size or 1), window=win)
            m_star, rho = g.m_star, g.rho
            theorem = entry.theorem
            if win < m_star:
                warnings.append(f"M = {win} < m* = {m_star}: {theorem} no longer applies")
            if g.i_circ is None or big_k < g.i_circ:
                warnings.append(f"k(n) = {big_k} < i° = {g.i_circ}: {theorem} no longer "
                                "applies")
        if tau is None:
            frac = (rho / 2) if rho else 1 / 16
            tau_fn: Any = statistical.Linear(frac)
            params["tau"] = f"n·{frac:g}" + (" (nρ/2 of the public model)" if rho else "")
        else:
            tau_fn = tau
            params["tau"] = tau
        if big_r is not None:
            r_fn: Any = big_r
            params["R"] = big_r
        else:
            r_fn = statistical.TimesPow2(64)
            params["R"] = "n·2^64"
        # each generator's own constructor: the witness window is M for Algorithm 3, the
        # threshold horizon M̄ for Algorithms 6 and 7
        if entry.cls is statistical.PointerGenerator:
            return entry.cls(k=big_k, big_r=r_fn), params, warnings
        if entry.cls is statistical.PrefixCountGenerator:
            return _make(entry.cls, {"k": big_k, "epsilon": eps, "tau": tau_fn, "big_m": win,
                                     "big_r": r_fn}), params, warnings
        kw = {"k": big_k, "epsilon": eps, "tau": tau_fn, "mbar": win, "big_r": r_fn}
        if gaussian:
            kw.update(delta=dlt, calibration=calibration)
        return _make(entry.cls, kw), params, warnings
    if entry.cls is not limit.UniformPrivateGenerator:
        if not entry.private:
            return entry.cls(), params, warnings
        return _make(entry.cls, {"epsilon": eps}), params, warnings
    upg = _make(entry.cls, {"epsilon": eps})
    return (upg if n is not None or data_mode else upg.continual()), params, warnings


def _make(cls: Any, kw: dict[str, Any]) -> Any:
    try:
        return cls(**kw)
    except ValueError as exc:
        fail(str(exc).splitlines()[0])


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------


def _stat_unit(args: tuple[Any, ...]) -> float:
    alg, collection, dist, n, runs, seed, offset = args
    from ..formal.evaluation import monte_carlo_error

    return monte_carlo_error(alg, collection, dist, n, runs, seed, unit_offset=offset).value * runs


@app.command("run")
def run(
    algorithm: str = typer.Argument(..., help="Algorithm name or paper number (000.3, …)."),
    instance_name: str | None = typer.Option(None, "--instance", help="Named instance."),
    n: int | None = typer.Option(None, "--n", help="Sample size (statistical setting)."),
    horizon: int | None = typer.Option(None, "--horizon", help="Stream horizon T (limit "
                                       "setting)."),
    epsilon: float | None = typer.Option(None, "--epsilon", help="Privacy parameter ε > 0."),
    delta: float | None = typer.Option(None, "--delta", help="δ ∈ (0, 1) (Gaussian "
                                       "algorithms; default 1e-6)."),
    k: int | None = typer.Option(None, "--k", help="Horizon K (languages searched); for the "
                                 "uniform private generator on sperner, the collection size."),
    tau: str | None = typer.Option(None, "--tau", help="Threshold τ > 0 (a number)."),
    window: int | None = typer.Option(None, "--window", help="Witness window M (Alg 3) or "
                                      "threshold horizon M̄ (Algs 6, 7)."),
    big_r: int | None = typer.Option(None, "--R", help="Output pool R ≥ n (default n·2^64)."),
    calibration: str = typer.Option("classical", "--calibration",
                                    help="Gaussian calibration: classical (ε < 1) or zcdp."),
    runs: int = typer.Option(200, "--runs", help="Simulation runs."),
    seed: int | None = seed_option("not stored", " Simulations (no --data): the Monte Carlo "
                                   "seed, default 0."),
    workers: int = typer.Option(1, "--workers", help="Worker processes."),
    out: Path | None = typer.Option(None, "--out", help="Directory for results.csv and "
                                    "results.manifest.json (must not exist)."),
    data: Path | None = typer.Option(None, "--data", help="A private sample (one element per "
                                     "line): a real release, charged to the ledger first."),
    collection_file: Path | None = typer.Option(None, "--collection", help="With --data: a "
                                                "public collection of DFAs (JSON)."),
    ledger: str | None = ledger_option(),
    dataset: str | None = dataset_option(),
) -> None:
    """Run an algorithm on an instance (simulation) or on --data (a charged release)."""
    alg_name = _algorithm_name(algorithm)
    if epsilon is not None and not epsilon > 0:
        fail(f"--epsilon must be > 0, got {epsilon}")
    if delta is not None and not 0 < delta < 1:
        fail(f"--delta must be in (0, 1), got {delta}")
    _positive("--n", n, integer=True)
    _positive("--horizon", horizon, integer=True)
    _positive("--k", k, integer=True)
    _positive("--window", window, integer=True)
    _positive("--runs", runs, integer=True)
    _positive("--workers", workers, integer=True)
    tau_v = _tau(tau)
    if seed is not None and seed < 0:
        fail(f"--seed must be >= 0, got {seed}")
    if n is not None and horizon is not None:
        fail("give either --n (statistical setting) or --horizon (limit setting), not both")
    if _statistical(alg_name) and horizon is not None:
        fail(f"--horizon given to {alg_name}, an algorithm of the statistical setting; use --n")
    if _streaming(alg_name) and n is not None:
        fail(f"--n given to {alg_name}, an algorithm of the limit setting; use --horizon")
    _check_out(out)
    if data is not None:
        from ..privacy.accounting import BudgetLimitError, check_budget_limit

        try:  # a release: the limit every command applies (docs/privacy.md, "Budget limits")
            check_budget_limit(epsilon, name="--epsilon")
        except BudgetLimitError as exc:
            fail(str(exc))
        if n is not None or horizon is not None:
            fail("with --data, n (or the horizon) is the number of elements in the file; do "
                 "not give --n or --horizon")
        if out is None:
            fail("--data needs --out (the release's directory)")
    elif collection_file is not None:
        fail("--collection is only for --data runs")
    if big_r is not None and n is not None and big_r < n:
        fail(f"--R must be >= n, got R = {big_r} < n = {n}")
    if big_r is not None and big_r < 1:
        fail(f"--R must be >= 1, got {big_r}")
    from ..formal.release import FormalDataError, custom_collection, release_on_data

    if collection_file is not None:
        try:
            coll = custom_collection(collection_file)
        except FormalDataError as exc:
            fail(str(exc))
        inst = None
    else:
        if instance_name is None:
            fail("--instance is required (or --data with --collection)")
        params: dict[str, Any] = {}
        if alg_name == "uniform-private" and k is not None and k > 20:
            fail(f"the uniform private generator enumerates 2^k subsets: k = {k} > 20")
        if alg_name == "uniform-private" and instance_name == "sperner" and k is not None:
            params["k"] = k
        inst = _instance(instance_name, **params)
        coll = inst.collection
        setting = "statistical" if _statistical(alg_name) else "limit"
        if setting not in inst.settings:
            fail(f"instance {instance_name} belongs to the {inst.settings[0]} setting; "
                 f"{alg_name} needs a {setting} instance")
    if data is None and _statistical(alg_name) and n is None:
        fail(f"{alg_name} needs --n (sample size)")
    if data is None and _streaming(alg_name) and horizon is None:
        fail(f"{alg_name} needs --horizon")
    if data is None and n is None and horizon is None:  # an algorithm of both settings
        fail(f"{alg_name} needs --n (one-shot) or --horizon (continual release)")
    fake_inst = inst if inst is not None else _CustomInstance(coll)
    k_alg = None if alg_name == "uniform-private" else k
    alg, params_used, warnings = _build(alg_name, fake_inst, n, epsilon, delta, k_alg, tau_v,
                                        window, calibration, big_r, data is not None)
    # a collection file by its name (its content is in the fingerprint): a path names the
    # user's folders in a public manifest
    params_used["instance"] = instance_name or (collection_file.name if collection_file
                                                else None)
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    if data is not None:
        try:
            res = release_on_data(alg, coll, data, out, _jsonable(params_used),  # type: ignore[arg-type]
                                  seed=seed, dataset=dataset, ledger=ledger,
                                  on_warning=lambda m: typer.echo(f"warning: {m}", err=True))
        except FormalDataError as exc:
            fail(str(exc))
        except BudgetExceeded as exc:
            fail(str(exc), code=3)
        except (ReleaseError, ValueError) as exc:
            from ..api.errors import input_error  # code 1, saying so, after the charge

            refusal = input_error(exc)
            fail(str(refusal), refusal.code)
        typer.echo(f"{alg_name} on {res.manifest['n']} elements of {data} → {out}")
        for row in res.rows[-3:]:
            typer.echo(f"  released: {row}")
        typer.echo(alg.guarantee(res.manifest["n"]).summary())
        return
    assert inst is not None
    try:
        rows, summary = _simulate(alg_name, alg, inst, n, horizon, runs,
                                  0 if seed is None else seed, workers)
    except ValueError as exc:
        fail(str(exc).splitlines()[0])
    g = alg.guarantee(n)
    for line in summary["lines"]:
        typer.echo(line)
    typer.echo(g.summary() if math.isfinite(g.epsilon) else
               f"{g.mechanism}: not private (ε = ∞), a non-private baseline.")
    if out is not None:
        from ..formal.experiments import rows_to_csv
        from ..release import OutputPaths, write_atomic, write_json

        out.mkdir(parents=True, exist_ok=True)
        paths = OutputPaths.of(out / "results.csv")
        write_atomic(paths.output, rows_to_csv(rows))
        write_json(paths.manifest, _jsonable({
            "command": "formal run", "algorithm": alg_name, "parameters": params_used,
            "n": n, "horizon": horizon, "runs": runs, "seed": 0 if seed is None else seed,
            "guarantee": g.to_dict(), "summary": summary["values"],
            "note": "a simulation on a public synthetic model: not a release of anyone's "
                    "data, not charged to a ledger"}))


class _CustomInstance:
    def __init__(self, collection: Any) -> None:
        self.collection = collection
        self.defaults: dict[str, Any] = {"k": int(collection.size or 2), "M": 3}
        self.settings = ("statistical", "limit")
        self.distribution = None


def _simulate(alg_name: str, alg: Any, inst: Any, n: int | None, horizon: int | None,
              runs: int, seed: int, workers: int) -> tuple[list[dict[str, Any]],
                                                          dict[str, Any]]:
    from ..formal import evaluation as ev
    from ..formal.experiments import _pmap
    from ..formal.registry import get_algorithm
    from ..privacy.randomness import RandomStreams

    lines: list[str] = []
    values: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    if _statistical(alg_name):
        assert n is not None
        dist = inst.distribution
        chunk = max(1, math.ceil(runs / max(1, workers)))
        tasks = [((alg, inst.collection, dist, n, min(chunk, runs - s), seed, s),)
                 for s in range(0, runs, chunk)]
        total = sum(_pmap(_stat_unit, tasks, workers))
        mean = total / runs
        lo, hi = ev.wilson(total, runs, 0.95)
        lines.append(f"{alg_name} on {inst.name}, n = {n}: Err = {mean:.4g} "
                     f"(95% Wilson [{lo:.3g}, {hi:.3g}], {runs} end-to-end runs)")
        values.update(err=mean, low=lo, high=hi, runs=runs)
        rows.append({"estimate": "monte-carlo", "n": n, "err": mean, "low": lo, "high": hi,
                     "runs": runs})
        exact = None
        try:
            if get_algorithm(alg_name).task == "identification":
                exact = ev.exact_identification_error(alg, inst.collection, dist, n)
            elif alg_name == "pointer":
                exact = ev.exact_pointer_error(alg, inst.collection, dist, n)
            else:
                exact = ev.exact_generation_error(alg, inst.collection, dist, n)
        except (ValueError, NotImplementedError):
            exact = None
        if exact is not None:
            lines.append(f"exact: Err = {exact.value:.6g} (ln Err = {exact.log_value:.6g})")
            values.update(exact=exact.value, log_exact=exact.log_value)
            rows.append({"estimate": "exact", "n": n, "err": exact.value,
                         "log_err": exact.log_value})
        return rows, {"lines": lines, "values": values}
    assert horizon is not None or n is not None
    identifies = get_algorithm(alg_name).task == "identification"
    target_index = inst.target
    target = inst.collection[target_index] if target_index else None
    ok = 0
    for r in range(runs):
        rng = RandomStreams(seed).generator(r, 0)
        st = inst.stream(seed=r)
        if alg_name == "uniform-private" and n is None:  # continual release
            res = alg.run(st, inst.collection, horizon, rng, target=target)
            last = res.segments[-1]
            rows.append({"run": r, "from_t": last.start, "to_t": last.end,
                         "output": "" if last.output is None else last.output.describe(),
                         "valid": last.valid, "last_invalid_t": res.last_invalid()})
            ok += bool(last.valid)
            continue
        if alg_name == "uniform-private":
            data = np.asarray(st.prefix(n), dtype=object)
            w, subset, u = alg.run(data, inst.collection, rng)
            good = bool(target is not None and u.is_infinite and u.issubset(target))
            rows.append({"run": r, "subset": format(subset, "b"), "output": str(w),
                         "valid_set": good})
            ok += good
            continue
        if alg_name == "closure":
            w = alg.output(st.prefix(horizon), inst.collection)
            good = bool(target is not None and target.contains(w))
            rows.append({"run": r, "output": str(w), "valid": good})
            ok += good
            continue
        if identifies:
            res = alg.run(st, inst.collection, horizon, rng, target_index=target_index)
        else:
            res = alg.run(st, inst.collection, horizon, rng, target=target, record=False)
        last = res.segments[-1]
        rows.append({"run": r, "from_t": last.start, "to_t": last.end,
                     "output": last.output if isinstance(last.output, int)
                     else last.output.describe(), "valid": last.valid,
                     "last_invalid_t": res.last_invalid()})
        ok += bool(last.valid)
    lo, hi = ev.wilson(ok, runs, 0.95)
    what = "correct" if identifies else "valid"
    at = f"n = {n}" if alg_name == "uniform-private" and n is not None else f"t = {horizon}"
    lines.append(f"{alg_name} on {inst.name}: {what} at {at} in {ok}/{runs} runs "
                 f"({ok / runs:.3g}, 95% Wilson [{lo:.3g}, {hi:.3g}])")
    values.update(fraction=ok / runs, low=lo, high=hi, runs=runs)
    from ..formal.streams import check_stream

    for w in check_stream(inst.stream(seed=0), target, horizon or n or 1):
        typer.echo(f"warning: {w}", err=True)
    return rows, {"lines": lines, "values": values}


# ---------------------------------------------------------------------------------------------
# reproduce
# ---------------------------------------------------------------------------------------------


@app.command("reproduce")
def reproduce(
    experiment: str = typer.Argument(..., help="Experiment name, e.g. price:thm4.5."),
    quick: bool = typer.Option(False, "--quick", help="Smaller grids (seconds)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the Monte Carlo parts."),
    workers: int = typer.Option(1, "--workers", help="Worker processes."),
    out: Path | None = typer.Option(None, "--out", help="Directory for results.csv, "
                                    "table.md, results.manifest.json and the plot."),
) -> None:
    """Reproduce one theorem's experiment (CSV, table, plot)."""
    from ..formal.experiments import EXPERIMENTS, run_experiment, write_result

    if experiment not in EXPERIMENTS:
        fail(f"unknown experiment {experiment!r}; see `dplang formal list`")
    _positive("--workers", workers, integer=True)
    if seed < 0:
        fail(f"--seed must be >= 0, got {seed}")
    _check_out(out)
    res = run_experiment(experiment, quick=quick, seed=seed, workers=workers)
    typer.echo(f"# {res.name}: {res.title}\n")
    typer.echo(res.table)
    typer.echo(f"\n({res.runtime_s:.1f} s{', quick' if quick else ''})")
    if out is not None:
        paths = write_result(res, out, parameters={"quick": quick, "seed": seed})
        typer.echo(f"wrote {', '.join(str(p) for p in paths.values())}")


# ---------------------------------------------------------------------------------------------
# audit
# ---------------------------------------------------------------------------------------------


@app.command("audit")
def audit(
    algorithm: str = typer.Argument(..., help="Algorithm name or paper number."),
    instance_name: str = typer.Option(..., "--instance", help="Named instance."),
    epsilon: float = typer.Option(..., "--epsilon", help="Claimed ε > 0."),
    delta: float | None = typer.Option(None, "--delta", help="δ for Gaussian algorithms."),
    twin: bool = typer.Option(False, "--twin", help="Audit the deliberately broken variant."),
    k: int | None = typer.Option(None, "--k", help="Horizon K (000; default min(4, the "
                                 "instance's K)); the size of Sperner(k) for uniform-private "
                                 "on sperner."),
    window: int | None = typer.Option(None, "--window", help="Witness window M or threshold "
                                      "horizon M̄ (000 generation; default min(4, the "
                                      "instance's M))."),
    max_n: int = typer.Option(5, "--max-n", help="Largest dataset size enumerated by the "
                              "exact 000 audit (≤ 5)."),
    monte_carlo: bool = typer.Option(False, "--monte-carlo", help="Force the black-box Monte "
                                     "Carlo audit (a lower bound on ε)."),
    exact: bool = typer.Option(False, "--exact", help="Force the exact audit."),
    trials: int = typer.Option(20000, "--trials", help="Monte Carlo runs per dataset."),
    seed: int = typer.Option(0, "--seed", help="Seed of the Monte Carlo audit."),
) -> None:
    """Audit an algorithm's privacy and print PASS/FAIL (exit 1 on FAIL) and the method used:
    exact when the output space has at most 2^16 atoms (the exact law over all neighbours of
    small datasets, or the exact transcript/profile), Monte Carlo otherwise (a lower bound on
    ε on a crafted pair); --exact / --monte-carlo force one."""
    from ..formal.audit import audit as run_audit
    from ..formal.audit import twin as broken_twin
    from ..formal.registry import get_algorithm

    alg_name = _algorithm_name(algorithm)
    if not epsilon > 0:
        fail(f"--epsilon must be > 0, got {epsilon}")
    if delta is not None and not 0 < delta < 1:
        fail(f"--delta must be in (0, 1), got {delta}")
    if not 1 <= max_n <= 5:
        fail(f"--max-n must be in 1..5, got {max_n}")
    if monte_carlo and exact:
        fail("give at most one of --exact and --monte-carlo")
    _positive("--trials", trials, integer=True)
    _positive("--k", k, integer=True)
    _positive("--window", window, integer=True)
    if trials < 2:
        fail(f"--trials must be >= 2, got {trials}")
    if seed < 0:
        fail(f"--seed must be >= 0, got {seed}")
    params: dict[str, Any] = {}
    if alg_name == "uniform-private" and k is not None:
        if k > 20:
            fail(f"the uniform private generator enumerates 2^k subsets: k = {k} > 20")
        if instance_name == "sperner":
            params["k"] = k
    inst = _instance(instance_name, **params)
    private = get_algorithm(alg_name).private
    eps_opt = epsilon if private else None
    if _statistical(alg_name):
        if "statistical" not in inst.settings:
            fail(f"instance {instance_name} is not a statistical instance")
        alg, _, _ = _build(alg_name, _AuditInstance(inst), None, eps_opt, delta,
                           k if k is not None else min(4, inst.defaults.get("k", 2)), 2.0,
                           window, "classical", None, True)
    else:
        if "limit" not in inst.settings:
            fail(f"instance {instance_name} is not a limit instance")
        alg, _, _ = _build(alg_name, inst, 1, eps_opt, delta, None, None, None, "classical",
                           None, True)
    if twin:
        if not private:
            fail(f"{alg_name} is not private; it is its own negative control")
        alg = broken_twin(alg)
    method = "monte-carlo" if monte_carlo else ("exact" if exact else None)
    try:
        report = run_audit(alg, inst, epsilon, method=method, max_n=max_n, trials=trials,
                           seed=seed)
    except ValueError as exc:
        fail(str(exc).splitlines()[0])
    typer.echo(report.line())
    typer.echo(report.method_line())
    if not report.passed:
        raise typer.Exit(1)


class _AuditInstance:
    def __init__(self, inst: Any) -> None:
        self.collection = inst.collection
        self.defaults = dict(inst.defaults)
        self.defaults["M"] = min(self.defaults.get("M", 3), 4)
        self.settings = inst.settings
        self.distribution = None
