"""Canaries through the whole pipeline: what InvisibleInk emits of a phrase in m references.

    PYTHONPATH=src .venv/bin/python benchmarks/canaries.py [--num 24] [-B 3] [-T 32]
        [--epsilons 1,10] [--repeats 1,1,2,5,20] [--data ../shared/data/yelp/dev.csv]
        [--model default] [--out results.json]

The first ``num × B`` rows of ``--data`` are copied into a temporary folder (mode 600, removed
at the end; never into the repository) twice: as they are, and with canary sentences inserted
(:mod:`dplang.evaluation.canaries`: one canary per entry of ``--repeats``, each in that many
distinct rows). For every ε, both copies are generated with InvisibleInk through the public
library API and the release pipeline (:mod:`dplang.textgen.orchestration`: plan, ledger charge,
manifest, private side file) with a throw-away ledger in the same temporary folder and the same
seed (coupled runs). The script prints, per ε and canary, the generations containing the canary
verbatim / near-verbatim (≥ 50 % of its word 3-grams) with and without it, and the bound the
guarantee implies on the rate with it (group privacy, k = 2m under replace-by-null).

``--out`` (optional) receives the full table as JSON, mode 600 (it describes generations from
the references).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dplang.evaluation.canaries import canary_table, insert_canaries, make_canaries
from dplang.io import load_references

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "yelp" / "dev.csv"


def _write_private_jsonl(path: Path, texts: list[str]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for text in texts:
            fh.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Generate with and without canaries for every ε; return the result dict."""
    from dplang.models import resolve_model
    from dplang.textgen.orchestration import GenerationRequest, execute_plan, plan_generation

    n_rows = args.num * args.batch_size
    records, _ = load_references(args.data, "text", limit=n_rows)
    texts = [r.text or "" for r in records]
    repeats = [int(x) for x in args.repeats.split(",")]
    canaries = make_canaries(repeats, len(texts), seed=args.canary_seed)
    epsilons = [float(x) for x in args.epsilons.split(",")]
    model_cache: dict[str, Any] = {}

    def load(spec: str) -> Any:
        if spec not in model_cache:
            model_cache[spec] = resolve_model(spec)
        return model_cache[spec]

    result: dict[str, Any] = {
        "settings": {"num": args.num, "batch_size": args.batch_size,
                     "max_tokens": args.max_tokens, "top_k": args.top_k,
                     "temperature": args.temperature, "delta": args.delta,
                     "repeats": repeats, "model": args.model, "seed": args.seed,
                     "data_rows": len(texts), "ngram": 3, "near_threshold": 0.5},
        "cells": [],
    }
    with tempfile.TemporaryDirectory(prefix="dplang-canaries-") as tmp_name:
        tmp = Path(tmp_name)
        os.chmod(tmp, 0o700)
        data = {"without": tmp / "without.jsonl", "with": tmp / "with.jsonl"}
        _write_private_jsonl(data["without"], texts)
        _write_private_jsonl(data["with"], insert_canaries(texts, canaries))
        for eps in epsilons:
            outputs: dict[str, list[str]] = {}
            rho = None
            seconds = {}
            for side, path in data.items():
                req = GenerationRequest(
                    data=path, out=tmp / f"{side}-eps{eps:g}.jsonl",
                    batch_size=args.batch_size, max_tokens=args.max_tokens,
                    temperature=args.temperature, top_k=args.top_k, epsilon=eps,
                    delta=args.delta, num=args.num, seed=args.seed, model=args.model,
                    ledger=tmp / "ledger.sqlite", dataset=f"canaries-{side}",
                )
                start = time.perf_counter()
                plan = plan_generation(req, load)
                execute_plan(plan)
                seconds[side] = time.perf_counter() - start
                rho = plan.guarantee.rho
                recs = [json.loads(x) for x in req.out.read_text(encoding="utf-8").splitlines()]
                outputs[side] = [r["text"] for r in sorted(recs, key=lambda r: r["group"])]
                print(f"ε={eps:g} {side}: {len(outputs[side])} texts in {seconds[side]:.0f} s",
                      file=sys.stderr, flush=True)
            assert rho is not None
            rows = canary_table(canaries, outputs["with"], outputs["without"], rho)
            result["cells"].append({"epsilon": eps, "rho": rho, "seconds": seconds,
                                    "rows": rows})
    return result


def render(result: dict[str, Any]) -> str:
    """A markdown table of the result."""
    lines = ["| ε | ρ | m | k=2m | verbatim with / without | near with / without | "
             "max 3-gram overlap with / without | bound on near rate with |",
             "|---:|---:|---:|---:|---|---|---|---:|"]
    for cell in result["cells"]:
        for r in cell["rows"]:
            w, wo = r["with"], r["without"]
            lines.append(
                f"| {cell['epsilon']:g} | {cell['rho']:.3g} | {r['repeats']} | "
                f"{r['group_size']} | {w['verbatim']}/{w['generations']} / "
                f"{wo['verbatim']}/{wo['generations']} | {w['near']} / {wo['near']} | "
                f"{w['max_overlap']:.2f} / {wo['max_overlap']:.2f} | "
                f"{r['bound_rate_with']:.3g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run, print the table (and write ``--out``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--num", type=int, default=24, help="generations per run")
    p.add_argument("-B", "--batch-size", type=int, default=3)
    p.add_argument("-T", "--max-tokens", type=int, default=32)
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--temperature", type=float, default=1.2)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--epsilons", default="1,10")
    p.add_argument("--repeats", default="1,1,2,5,20")
    p.add_argument("--model", default="default")
    p.add_argument("--seed", type=int, default=18)
    p.add_argument("--canary-seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    # SIGTERM as an exception, so that the temporary copies of the data are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run(args)
    print(render(result))
    if args.out is not None:
        from dplang.evaluation.canaries import write_canary_report

        write_canary_report(result, args.out)


if __name__ == "__main__":
    main()
