"""One prepared check of dplang on a GPU: invariance, neighbours, GPU tests and throughput.

    python scripts/gpu_check.py [--device cuda] [--groups 1,8,64,256] [--tokens 64]
                                [--budget 420] [--quick]

Made for a lent GPU machine as it is: no network, its own PyTorch and transformers, no numba,
at most 64 MiB carried with the working tree. So the model is Gemma 3 270M's exact
architecture (``scripts/gemma3_270m_config.json``) with random weights built on the device
(same shapes, same speed, the same invariance question as the real weights), with a small
tokenizer trained here on a few sentences; prompts are random words of the lengths of the
Yelp prompts (about 135 tokens). dplang runs from ``src/`` on the machine's own PyTorch.

Prints one line per step and, last, one JSON summary:

1. the load-time row-invariance check in float32 and bfloat16 (verdict, seconds);
2. the decode graphs (:mod:`dplang.models.decode_graphs`) against kernel-by-kernel launches
   on a short run (64 groups, 16 tokens): the same tokens, and the time of each (a failure
   turns the graphs off for the rest of the check); then a neighbour test: G groups decoded
   with InvisibleInk, then again with one reference of group 0 replaced by the empty one:
   every other group's tokens must be identical;
3. ``pytest -m gpu`` (if pytest is installed there);
4. a profile of a short DP run (64 groups, 8 tokens): top operators by GPU and CPU time;
5. DP tokens/s at each G of ``--groups`` (B = 7, T tokens, EOS ignored) beside non-private
   decoding of the same rows (one text per private prompt) measured in the same run, and the
   DP cost multiple per token; and beside the non-private peer of issue 38, Hugging Face
   ``generate()`` in bfloat16 with a static cache on all G·(B + 1) rows (``--no-peer`` to
   skip it): dplang's rows/s (DP tok/s × (B + 1)) over its tokens/s;
6. with ``--long G:T`` (``gpu_check.sh``: 256:512, the paper's long-form setting), one DP run of
   the default architecture at G groups and T tokens, if the budget left covers its projection.

``--budget`` seconds bounds the throughput part: a G whose projected time (the last G's
seconds per group and token, times G and T) would overrun it runs with fewer tokens (at least
8; its row says T), or is skipped and said so. Every finished step
is written to ``$OUT/gpu_check.json`` at once. ``--quick`` is a smoke test on any device (two
layers, a vocabulary of 512, tiny sizes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

B, K, TAU, EPS, DELTA = 7, 50, 1.2, 10.0, 1e-6
WORDS = ["the", "food", "was", "great", "and", "service", "friendly", "but", "pasta", "cold",
         "we", "waited", "an", "hour", "for", "pizza", "dessert", "good", "staff", "rude",
         "clean", "place", "prices", "fair", "would", "come", "back", "again", "never", "table",
         "order", "drinks", "menu", "tasty", "salad", "burger", "fries", "coffee", "tea",
         "breakfast", "lunch", "dinner"]


def tokenizer_dir() -> Path:
    """A small BPE tokenizer (no download), saved to a temporary folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder = Path(tempfile.mkdtemp(prefix="dplang-gpu-check-"))
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<eos>", "<bos>",
                                                                  "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    backend.train_from_iterator([" ".join(WORDS)] * 20, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>",
                                  eos_token="<eos>", bos_token="<bos>", unk_token="<unk>")
    tok.save_pretrained(folder)
    return folder


#: ``--quick``: the same architecture cut to two layers (one sliding, one full) and a
#: vocabulary of 512, so that a smoke test of the script runs in a minute on a CPU.
QUICK = {"num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"],
         "vocab_size": 512, "sliding_window": 16}


#: 1B-class architectures of the InvisibleInk paper's models (issue 38), as configurations:
#: random weights of these shapes decode at the real models' speed.
ARCHITECTURES: dict[str, dict] = {
    "tinyllama-1.1b": {
        "model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
        "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
        "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2},
    "llama3.2-1b": {
        "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
        "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128001,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
}
#: ``--quick`` for the other architectures: two layers, a small vocabulary.
QUICK_OTHER = {"num_hidden_layers": 2, "vocab_size": 512, "intermediate_size": 256,
               "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 32, "bos_token_id": 1, "eos_token_id": 2}


def random_model(device: str, quick: bool = False, arch: str = "default"):
    from transformers import AutoConfig, AutoModelForCausalLM

    if arch == "default":
        values = json.loads((ROOT / "scripts" / "gemma3_270m_config.json").read_text())
        values = {**values, **(QUICK if quick else {})}
    else:
        values = {**ARCHITECTURES[arch], **(QUICK_OTHER if quick else {})}
    config = AutoConfig.for_model(**values)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model


def load(device: str, dtype: str, check: bool, quick: bool = False, arch: str = "default"):
    from transformers import AutoTokenizer

    from dplang.models.transformers import TransformersModel

    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    start = time.perf_counter()
    name = "gemma-3-270m" if arch == "default" else arch
    model = TransformersModel(model=random_model(device, quick, arch), tokenizer=tok,
                              device=device, dtype=dtype, check_invariance=check, verify=True,
                              model_id=f"{name}-architecture-random-{dtype}")
    return model, time.perf_counter() - start


def hf_peer(arch: str, device: str, quick: bool, prompts: list[str], tokens: int,
            compile_: bool, cache: dict) -> dict:
    """The non-private peer of issue 38: Hugging Face ``generate()`` in bfloat16 with a static
    cache (compiled only with ``--peer-compile``: compiling can take minutes of the lent
    time), sampling top-k at τ, every row exactly ``tokens`` new tokens, one batch of all
    ``prompts`` (left-padded). Returns its tokens/s and seconds."""
    from transformers import AutoTokenizer

    if arch not in cache:
        cache.clear()  # one peer model at a time on the device
        cache[arch] = random_model(device, quick, arch).to(torch.bfloat16).eval()
    hf = cache[arch]
    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True).to(device)
    options = {"do_sample": True, "top_k": K, "temperature": TAU, "min_new_tokens": tokens,
               "max_new_tokens": tokens, "cache_implementation": "static",
               "pad_token_id": tok.pad_token_id, "eos_token_id": None,
               "disable_compile": not compile_}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        hf.generate(**enc, **{**options, "min_new_tokens": 2, "max_new_tokens": 2})  # warm
        sync()
        t0 = time.perf_counter()
        out = hf.generate(**enc, **options)
        sync()
    secs = time.perf_counter() - t0
    made = (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]
    return {"tokens_per_s": round(made / secs, 1), "seconds": round(secs, 2),
            "rows": out.shape[0], "compiled": compile_}


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def jobs(model, groups: int, rng: random.Random, words: int):
    from dplang.textgen.engine import GroupJob

    out = []
    for g in range(groups):
        public = "Here is a review of a restaurant:\n"
        private = tuple(f"Here is a review of a restaurant:\n{text(rng, words)}\n\n"
                        "Here is another review of a restaurant:\n" for _ in range(B))
        out.append(GroupJob(g, public, private, prefix="Here is a review of a restaurant:\n"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--groups", default="1,8,64,256")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--budget", type=float, default=420.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--arch", default="default",
                    help="architectures of the throughput part, comma-separated: default "
                         f"(Gemma 3 270M), {', '.join(ARCHITECTURES)} (random weights)")
    ap.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                    help="time Hugging Face generate() (bfloat16, static cache) on the G·(B+1) "
                         "rows of each G beside dplang")
    ap.add_argument("--peer-compile", action="store_true",
                    help="let generate() compile its forward (minutes on a fresh machine)")
    ap.add_argument("--long", default="",
                    help="G:T of a last, long-form DP run of the default architecture (issue "
                         "38: 256:512), made only if the budget left covers its projection")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                    help="profile a short DP run (8 tokens, 64 groups; 2 with --quick) before "
                         "the throughput")
    args = ap.parse_args()
    from dplang.privacy import RandomStreams, epsilon_to_rho
    from dplang.textgen.engine import DecodingParams, run_plain
    from dplang.textgen.methods.invisibleink import calibrate_clip, run_invisibleink

    summary: dict = {"device": args.device, "torch": torch.__version__}
    if args.device == "cuda":
        summary["gpu"] = torch.cuda.get_device_name(0)
    words = 8 if args.quick else 110
    tokens = 4 if args.quick else args.tokens
    groups = [1, 2] if args.quick else [int(g) for g in args.groups.split(",")]

    # 1. the load-time check in both precisions
    from dplang.models.invariance import RowInvarianceError

    models = {}
    for dtype in ("float32", "bfloat16"):
        try:
            models[dtype], secs = load(args.device, dtype, check=True, quick=args.quick)
            summary[f"invariance_{dtype}"] = {"verdict": "pass", "seconds": round(secs, 1)}
        except RowInvarianceError as exc:
            summary[f"invariance_{dtype}"] = {"verdict": "refused", "message": str(exc)[:400]}
        print(f"invariance {dtype}: {summary[f'invariance_{dtype}']}", flush=True)
    if "float32" not in models:
        models["float32"], _ = load(args.device, "float32", check=False, quick=args.quick)
    models.pop("bfloat16", None)  # checked; its memory is for the larger G below
    free_memory(args.device)
    from dplang.models.kernels import triton_check

    # which Triton kernels passed their self-test on this GPU (the model admitted them)
    summary["triton_kernels"] = triton_check.admit_kernels(args.device)
    print(f"triton kernels admitted: {summary['triton_kernels']}", flush=True)
    model = models["float32"]
    clip = calibrate_clip(epsilon_to_rho(EPS, DELTA), tokens, B, TAU)
    params = DecodingParams(clip, B, TAU, K, tokens, sparse_head=True, stop_at_eos=False)

    # 2. decode graphs against launching kernel by kernel: the same tokens, the time of each.
    # First, so that a graph that fails its check (which stops a run) costs only this step:
    # the graphs are then turned off for everything after it.
    try:
        summary["decode_graphs"] = graphs_ab(model, params, args.device, args.quick, words)
    except Exception as exc:  # the summary must still be printed
        summary["decode_graphs"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    graphs = summary["decode_graphs"]
    if "error" in graphs or not graphs.get("same_tokens", False):
        os.environ["DPLANG_NO_CUDA_GRAPHS"] = "1"
        graphs["turned_off_for_the_rest"] = True
    model.set_decode_graphs("auto")
    print(f"decode graphs: {summary['decode_graphs']}", flush=True)
    save(summary)

    # 2b. neighbours: null one reference of group 0; the other groups must not move
    rng = random.Random(1)
    base = jobs(model, 4, rng, words)
    neighbour = list(base)
    first = base[0]
    neighbour[0] = type(first)(first.index, first.public_prompt,
                               (first.public_prompt, *first.private_prompts[1:]), first.prefix)
    runs = []
    for dataset in (base, neighbour):
        results = run_invisibleink(model, dataset, params, RandomStreams(7), concurrent_groups=4)
        runs.append({r.index: r.token_ids for r in results})
    same = all(runs[0][g] == runs[1][g] for g in (1, 2, 3))
    summary["neighbours"] = {"other_groups_identical": same,
                             "group_0_changed": runs[0][0] != runs[1][0]}
    print(f"neighbours: {summary['neighbours']}", flush=True)
    save(summary)

    # 3. the GPU tests
    try:
        import pytest  # noqa: F401

        # Only the files that hold GPU tests: collecting the whole suite would import what
        # the lent machine lacks (opendp, numba's CPU kernels are optional) for nothing.
        gpu_files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                           if "mark.gpu" in p.read_text(encoding="utf-8"))
        # a file that cannot be collected there (a test library missing) costs only itself
        done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p",
                               "no:cacheprovider", "--continue-on-collection-errors",
                               *gpu_files], cwd=ROOT, capture_output=True,
                              text=True, timeout=240, check=False,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        summary["pytest_gpu"] = {"exit": done.returncode,
                                 "tail": done.stdout.strip().splitlines()[-1:]}
    except ImportError:
        summary["pytest_gpu"] = {"exit": None, "tail": ["pytest is not installed here"]}
    print(f"pytest -m gpu: {summary['pytest_gpu']}", flush=True)

    save(summary)

    # 4. the profile of a short run (before the throughput, whose length is the least certain)
    if args.profile:
        try:
            summary["profile"] = profile(model, params, groups[-1] if args.quick else 64, words,
                                         args.device)
        except Exception as exc:  # the summary must still be printed
            summary["profile"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        save(summary)

    # 5. throughput: DP beside non-private decoding of the same private prompts
    rng = random.Random(2)
    start = time.perf_counter()
    rows: list[dict] = []
    summary["throughput"] = rows
    plan = [(arch, g) for arch in args.arch.split(",") for g in groups]
    current = "default"
    per_token_group_s = 0.0  # seconds per token and group at the last G (DP + non-private)
    peers: dict = {}  # the Hugging Face peer model of the current architecture
    dp_per_token_group: dict[int, float] = {}  # default architecture: DP s / (token · group)
    too_large: dict[str, int] = {}  # per architecture, the smallest G that failed
    for arch, g in plan:
        if arch != current:  # another architecture: its own model, checked at load
            model, secs = load(args.device, "float32", check=True, quick=args.quick,
                               arch=arch)
            summary[f"invariance_{arch}"] = {"verdict": "pass", "seconds": round(secs, 1)}
            print(f"invariance {arch}: {summary[f'invariance_{arch}']}", flush=True)
            current, per_token_group_s = arch, 0.0
        left = args.budget - (time.perf_counter() - start)
        run_tokens = tokens
        if per_token_group_s * g * tokens > left:
            # Too long at T tokens: measure fewer (at least 8), said so in the row.
            run_tokens = int(left / (per_token_group_s * g))
            if run_tokens < 8:
                rows.append({"arch": arch, "G": g,
                             "skipped": f"budget: ~{per_token_group_s * g * tokens:.0f} s "
                                        f"projected, {left:.0f} s left"})
                print(f"throughput: {rows[-1]}", flush=True)
                continue
        params = type(params)(params.clip, B, TAU, K, run_tokens, params.sparse_head,
                              params.stop_at_eos)
        batch = jobs(model, g, rng, words)
        sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
        prompts = [p for j in batch for p in j.private_prompts]
        if arch in too_large and g >= too_large[arch]:
            rows.append({"arch": arch, "G": g, "skipped": f"G = {too_large[arch]} did not run"})
            print(f"throughput: {rows[-1]}", flush=True)
            continue
        failure = None
        try:  # a G that does not fit (out of memory) must not cost the rows after it
            dp_s = timed_dp(model, batch, params, 3, args.device)
            t0 = time.perf_counter()
            run_plain(model, prompts, run_tokens, TAU, K, RandomStreams(4), stop_at_eos=False)
            sync()
            plain_s = time.perf_counter() - t0
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"[:300]
        if failure is not None:  # outside the except: its traceback no longer holds tensors
            rows.append({"arch": arch, "G": g, "T": run_tokens, "error": failure})
            too_large[arch] = g  # a larger G of this architecture would fail as well
            print(f"throughput: {rows[-1]}", flush=True)
            free_memory(args.device)
            save(summary)
            continue
        dp_tps = g * run_tokens / dp_s
        plain_tps = len(prompts) * run_tokens / plain_s
        rows.append({"arch": arch, "G": g, "T": run_tokens,
                     "dp_tokens_per_s": round(dp_tps, 1),
                     # every DP token is B + 1 rows of the model: what the peer is judged on
                     "dp_rows_per_s": round(dp_tps * (B + 1), 1),
                     "plain_tokens_per_s_same_prompts": round(plain_tps, 1),
                     "dp_cost_per_token_vs_plain": round(plain_tps / dp_tps, 2),
                     "dp_seconds": round(dp_s, 2), "plain_seconds": round(plain_s, 2)})
        peer_s = 0.0
        if args.peer:
            rows_prompts = [p for j in batch for p in (*j.private_prompts, j.public_prompt)]
            try:
                peer = hf_peer(arch, args.device, args.quick, rows_prompts, run_tokens,
                               args.peer_compile, peers)
                peer_s = peer["seconds"]
                rows[-1]["hf_generate"] = peer
                rows[-1]["dp_rows_vs_hf_tokens"] = round(
                    rows[-1]["dp_rows_per_s"] / peer["tokens_per_s"], 3)
            except Exception as exc:  # the peer must not cost the rest of the run
                rows[-1]["hf_generate"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(f"throughput: {rows[-1]}", flush=True)
        per_token_group_s = (dp_s + plain_s + peer_s) / (g * run_tokens)
        if arch == "default":
            dp_per_token_group[g] = dp_s / (g * run_tokens)
        save(summary)
    if args.long:
        model = None  # the last architecture's model: its memory is for the long run
        free_memory(args.device)
        g_long = int(args.long.split(":")[0])
        if "default" in too_large and g_long >= too_large["default"]:
            summary["long"] = {"skipped": f"G = {too_large['default']} did not run"}
        else:
            try:
                summary["long"] = long_run(args, models["float32"], dp_per_token_group,
                                           start, words)
            except Exception as exc:  # the summary must still be printed
                summary["long"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(f"long: {summary['long']}", flush=True)
    save(summary)
    print(json.dumps(summary))


def long_run(args: argparse.Namespace, model, per_token_group: dict[int, float], start: float,
             words: int) -> dict:
    """The long-form DP run ``--long G:T`` on the default architecture, if the budget left
    covers its projection (the DP seconds per token and group measured at the nearest G)."""
    from dplang.privacy import epsilon_to_rho
    from dplang.textgen.engine import DecodingParams
    from dplang.textgen.methods.invisibleink import calibrate_clip

    g, t = (int(x) for x in args.long.split(":"))
    if not per_token_group:
        return {"G": g, "T": t, "skipped": "no default-architecture throughput to project from"}
    nearest = min(per_token_group, key=lambda x: abs(x - g))
    projected = per_token_group[nearest] * g * t
    left = args.budget - (time.perf_counter() - start)
    if projected > left:
        return {"G": g, "T": t, "skipped": f"budget: ~{projected:.0f} s projected, "
                                           f"{left:.0f} s left"}
    params = DecodingParams(calibrate_clip(epsilon_to_rho(EPS, DELTA), t, B, TAU), B, TAU, K,
                            t, sparse_head=True, stop_at_eos=False)
    seconds = timed_dp(model, jobs(model, g, random.Random(6), words), params, 8, args.device)
    return {"G": g, "T": t, "dp_tokens_per_s": round(g * t / seconds, 1),
            "seconds": round(seconds, 1)}


def timed_dp(model, batch: list, params, seed: int, device: str) -> float:
    """Seconds of one DP run of ``batch``, all groups at once (the device synchronised)."""
    from dplang.privacy import RandomStreams
    from dplang.textgen.methods.invisibleink import run_invisibleink

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    run_invisibleink(model, batch, params, RandomStreams(seed), concurrent_groups=len(batch))
    sync()
    return time.perf_counter() - t0


def graphs_ab(model, params, device: str, quick: bool, words: int) -> dict:
    """A short DP run with decode calls launched kernel by kernel (``off``) and replayed from
    CUDA graphs (``auto``), each twice (the second run timed; a run records its graphs, as a
    user's run does): the same tokens, and seconds."""
    from dplang.models.decode_graphs import graphs_wanted
    from dplang.privacy import RandomStreams
    from dplang.textgen.methods.invisibleink import run_invisibleink

    g, t = (2, 4) if quick else (64, 16)
    short = type(params)(params.clip, B, TAU, K, t, params.sparse_head, params.stop_at_eos)
    batch = jobs(model, g, random.Random(3), words)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    seconds: dict[str, float] = {}
    tokens: dict[str, dict] = {}
    for mode in ("off", "auto", "off", "auto"):
        model.set_decode_graphs(mode)
        sync()
        t0 = time.perf_counter()
        results = run_invisibleink(model, batch, short, RandomStreams(11), concurrent_groups=g)
        sync()
        seconds[mode] = time.perf_counter() - t0
        tokens[mode] = {r.index: r.token_ids for r in results}
    return {"G": g, "T": t, "seconds_off": round(seconds["off"], 3),
            "seconds_graphs": round(seconds["auto"], 3),
            "speedup": round(seconds["off"] / seconds["auto"], 2),
            "same_tokens": tokens["off"] == tokens["auto"],
            "graphs_refused": model.graphs_refused,
            # whether "auto" replayed graphs here at all (a CUDA GPU, every kernel admitted)
            "graphs_used": graphs_wanted(model.device) and model.graphs_refused is None}


def free_memory(device: str) -> None:
    """Return what the dropped tensors held to the device (after an out-of-memory error, or
    a model no longer used)."""
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def save(summary: dict) -> None:
    """Write what is known so far to ``$OUT/gpu_check.json`` (a run stopped at its limit keeps
    every finished step)."""
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_check.json").write_text(json.dumps(summary, indent=1))


def profile(model, params, groups: int, words: int, device: str) -> dict:
    """Where a DP run's time goes on the GPU: the top operators of a short run at ``groups``
    groups by self CUDA time and by self CPU time (launch overhead shows as CPU time)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from dplang.privacy import RandomStreams
    from dplang.textgen.methods.invisibleink import run_invisibleink

    short = type(params)(params.clip, params.batch_size, params.temperature, params.top_k, 8,
                         params.sparse_head, params.stop_at_eos)
    batch = jobs(model, groups, random.Random(5), words)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    run_invisibleink(model, batch, short, RandomStreams(9), concurrent_groups=groups)  # warm
    sync()
    with torch_profile(activities=activities) as prof:
        t0 = time.perf_counter()
        run_invisibleink(model, batch, short, RandomStreams(9), concurrent_groups=groups)
        sync()
        wall = time.perf_counter() - t0
    events = prof.key_averages()

    def top(key: str) -> list:
        rows = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)[:12]
        return [[e.key[:60], e.count, round(getattr(e, key, 0) / 1e3, 1)] for e in rows]

    cuda_total = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e3

    def per_step(*needles: str) -> float:  # events per decode step (8 tokens, 8 calls)
        return round(sum(e.count for e in events if any(n in e.key for n in needles)) / 8, 1)

    result = {"groups": groups, "tokens": 8, "wall_ms": round(wall * 1e3, 1),
              "gpu_busy_ms": round(cuda_total, 1),
              # the batched step's contract: one device-to-host copy per step
              "per_step": {"launches": per_step("cudaLaunchKernel", "cuLaunchKernel"),
                           "device_to_host": per_step("DtoH", "Memcpy DtoH"),
                           "synchronize": per_step("Synchronize"),
                           "scalar_reads": per_step("_local_scalar_dense")},
              "top_gpu_ms": top("self_device_time_total"), "top_cpu_ms": top("self_cpu_time_total")}
    print(f"profile: {result}", flush=True)
    return result


if __name__ == "__main__":
    main()
