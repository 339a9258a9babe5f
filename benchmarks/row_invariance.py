"""DP generation with this checkout's code against an earlier commit's, side by side in one run.

    .venv/bin/python benchmarks/row_invariance.py [--against fcc082b] [--current HEAD]
                                                  [--groups 8] [--slots G] [--tokens 64]
                                                  [--rounds 3]
                                                  [--dtype float32|bfloat16] [--eos]
                                                  [--form completion|instruction]

What row-invariant decoding costs: ``--against fcc082b`` (the last backend that was not
row-invariant), EOS ignored. What continuous batching of groups and the shared public prefix
gain: ``--against 3d82b81 --eos`` (waves of G groups, every prompt prefilled whole),
on completion prompts and on the paper's instruction prompts (``--form instruction``); with
``--slots S`` below ``--groups`` the engine decodes at most S groups at once (waves of S in the
earlier commit, a newcomer admitted as soon as a group retires in the current one).

Both decode the same G groups of B = 7 Yelp references (k = 50, τ = 1.2, ε = 10, T tokens;
EOS ignored unless ``--eos``, so that both do the same work) with the default model. Each
measurement runs in its own process (each commit's ``src/`` is extracted with ``git archive``
into a temporary folder and put first on ``PYTHONPATH``, so edits to the working tree during a
run change nothing); the two alternate for ``--rounds`` rounds and
each keeps its best, so that drift of the machine hits both alike. Printed: seconds per
generation, DP tokens/s (end to end, prompts included) and the median decode step, and the
ratio current / earlier (the target for row invariance: at most 1.2 per DP token at G = 8).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "yelp" / "dev.csv"
B, K, TAU, EPS, DELTA = 7, 50, 1.2, 10.0, 1e-6


def yelp_jobs(model, groups: int, form: str = "completion") -> list:
    """``groups`` groups of B Yelp references (in file order) as the engine's jobs, prompts
    rendered and references cut to 256 tokens as ``dplang generate`` does, with the shared
    public prefix where the code being measured has one (since 2f50b1f)."""
    from dplang.io import load_references
    from dplang.textgen.engine import GroupJob
    from dplang.textgen.prompts import get_template

    records, _ = load_references(DATA, "text", ("label1", "label2"), limit=groups * B)
    template = get_template("yelp", chat=form == "instruction")
    takes_prefix = "prefix" in {f.name for f in dataclasses.fields(GroupJob)}
    jobs = []
    for g in range(groups):
        chunk = records[g * B:(g + 1) * B]
        labels = chunk[0].labels
        public = model.render_prompt(template.render(None, labels), template.system)
        private = tuple(model.render_prompt(
            template.render(model.truncate_tokens(r.text or "", 256), labels), template.system)
            for r in chunk)
        if takes_prefix:
            jobs.append(GroupJob(g, public, private, _prefix(model, template, labels, public)))
        else:
            jobs.append(GroupJob(g, public, private))
    return jobs


def _prefix(model, template, labels: dict, public: str) -> str:
    """The rendered text every prompt of a group starts with (as orchestration computes it)."""
    sentinel = "\x00dplang-reference\x00"
    rendered = model.render_prompt(template.render(sentinel, labels), template.system)
    head = rendered[:max(rendered.find(sentinel), 0)]
    length = 0
    for a, b in zip(head, public, strict=False):
        if a != b:
            break
        length += 1
    return head[:length]


def _skip_invariance_check() -> None:
    """Let an earlier commit run where its load-time check refuses the default model (its
    row invariance rested on oneDNN's kernel choice: main before the exact decoder refuses it
    on this project's Cascade Lake machine). Only for timing: nothing is released."""
    from dplang.models import invariance, transformers

    for module in (invariance, transformers):
        if hasattr(module, "check_row_invariance_cached"):
            module.check_row_invariance_cached = lambda model: True
    transformers.TransformersModel.check_row_invariance = lambda self: None


def worker(groups: int, tokens: int, dtype: str, eos: bool = False,
           form: str = "completion", slots: int | None = None,
           unchecked: bool = False) -> dict[str, float]:
    """One measurement with whatever ``dplang`` is first on the path."""
    import torch

    import dplang
    if unchecked:
        _skip_invariance_check()
    from dplang.models import load_default_model
    from dplang.privacy import RandomStreams, epsilon_to_rho
    from dplang.textgen.engine import DecodingParams
    try:  # this checkout
        from dplang.textgen.methods.invisibleink import calibrate_clip, run_invisibleink
    except ImportError:  # an earlier commit (before the method registry)
        from dplang.privacy import calibrate_clip  # type: ignore[attr-defined,no-redef]
        from dplang.textgen.engine import run_invisibleink  # type: ignore[attr-defined,no-redef]

    start = time.perf_counter()
    model = load_default_model(dtype=dtype)
    load_s = time.perf_counter() - start
    jobs = yelp_jobs(model, groups, form)
    clip = calibrate_clip(epsilon_to_rho(EPS, DELTA), tokens, B, TAU)
    params = DecodingParams(clip, B, TAU, K, tokens, sparse_head=True, stop_at_eos=eos)
    emitted: list[int] = []
    stamps: list[float] = []
    start = time.perf_counter()
    results = run_invisibleink(model, jobs, params, RandomStreams(0),
                               concurrent_groups=slots or groups,
                               on_step=lambda _n: stamps.append(time.perf_counter()))
    secs = time.perf_counter() - start
    emitted = [r.num_tokens for r in results]
    steps = [b - a for a, b in itertools.pairwise(stamps)]
    digest = hashlib.sha256(json.dumps(sorted((r.index, r.token_ids) for r in results))
                            .encode()).hexdigest()[:16]
    return {"seconds": secs, "step_ms": 1e3 * statistics.median(steps), "load_s": load_s,
            "tokens": float(sum(emitted)), "texts": digest,  # type: ignore[dict-item]
            "threads": torch.get_num_threads(), "source": str(Path(dplang.__file__).parent)}


def extract(commit: str, into: Path) -> Path:
    """``src/`` of ``commit`` unpacked under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def measure(src: Path | None, args: argparse.Namespace, dtype: str | None = None
            ) -> dict[str, float]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, __file__, "--worker", "--groups", str(args.groups), "--tokens",
         str(args.tokens), "--dtype", dtype or args.dtype, "--form", args.form,
         "--slots", str(args.slots or args.groups),
         *(["--eos"] if args.eos else []),
         *(["--unchecked"] if args.unchecked and src is not None and "earlier" in str(src)
           else [])],
        check=False, capture_output=True, text=True, env=env,
    )
    if out.returncode != 0:  # say why: the worker's own error, not only its exit status
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"the measurement of {src or 'this checkout'} failed "
                         f"(exit {out.returncode}):\n{tail}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="fcc082b", help="earlier commit to compare with")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--slots", type=int, default=None,
                    help="groups decoded at once (default: all of them)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--current", default="HEAD", help="the commit measured as 'current'")
    ap.add_argument("--current-dtype", default=None, choices=("float32", "bfloat16"),
                    help="the current code's precision when it differs from --dtype (each "
                         "commit in its own default: --dtype float32 --current-dtype "
                         "bfloat16)")
    ap.add_argument("--eos", action="store_true", help="honour EOS (groups end unevenly)")
    ap.add_argument("--form", default="completion", choices=("completion", "instruction"))
    ap.add_argument("--unchecked", action="store_true",
                    help="skip the earlier commit's load-time invariance check (it refuses the "
                         "default model on some CPUs; timing only)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.groups, args.tokens, args.dtype, args.eos, args.form,
                                args.slots, args.unchecked)))
        return
    best: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        earlier = extract(args.against, Path(tmp) / "earlier")
        current = extract(args.current, Path(tmp) / "current")
        for r in range(args.rounds):
            for name, src in (("current", current), (args.against, earlier)):
                result = measure(src, args, args.current_dtype if name == "current" else None)
                print(f"round {r + 1} {name:>10}: {result['seconds']:.1f} s, decode step "
                      f"{result['step_ms']:.0f} ms", flush=True)
                if name not in best or result["seconds"] < best[name]["seconds"]:
                    best[name] = result
    texts = args.groups
    print(f"\n{args.groups} groups, {args.slots or args.groups} at once, B = {B}, "
          f"T = {args.tokens}, dtype {args.dtype}"
          + (f" (current: {args.current_dtype})" if args.current_dtype else "") + ", "
          f"{args.form} prompts, EOS {'honoured' if args.eos else 'ignored'}, "
          f"{best['current']['threads']} threads; best of {args.rounds} rounds")
    print(f"{'code':>12} {'s / text':>9} {'DP tok/s':>9} {'tokens':>7} {'step ms':>8}")
    for name, res in best.items():
        emitted = res.get("tokens", args.groups * args.tokens)
        print(f"{name:>12} {res['seconds'] / texts:>9.2f} {emitted / res['seconds']:>9.2f} "
              f"{emitted:>7.0f} {res['step_ms']:>8.0f}")
    ratio = best["current"]["seconds"] / best[args.against]["seconds"]
    step = best["current"]["step_ms"] / best[args.against]["step_ms"]
    same = not args.current_dtype or args.current_dtype == args.dtype
    identical = best["current"].get("texts") == best[args.against].get("texts")
    texts_said = ("each in its precision" if not same else "same texts" if identical
                  else "DIFFERENT texts" if "texts" in best[args.against] else "texts unchecked")
    print(f"time current / {args.against}: {ratio:.2f}x end to end ({texts_said}), "
          f"{step:.2f}x per decode step")


if __name__ == "__main__":
    main()
