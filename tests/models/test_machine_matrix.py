"""Other machines, simulated: the same rows give the same bits under other CPU vector ISAs
(oneDNN's ``ONEDNN_MAX_CPU_ISA``, PyTorch's ``ATEN_CPU_CAPABILITY``), thread counts, with and
without the fused kernels, alone or among up to 70 rows.

Row invariance rests on exact integer sums and correctly rounded elementwise operations
(docs/privacy.md), so the bits cannot depend on any of these; each configuration runs in a
process of its own and prints a digest of every row's hidden states and logits. A
representative part runs in ``make test``; the whole matrix is marked ``slow``."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

_PROBE = r'''
import gc, hashlib, json, sys, torch
from dplang.models.transformers import RowDecodeState, TransformersModel
path, dtypes, block = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
counts = [int(c) for c in sys.argv[4].split(",")]
from dplang.models.exact import IntegerLinear
out = {}
packed = []
for dtype in dtypes:
  model = TransformersModel(path, dtype=dtype, block_size=block, check_invariance=False,
                            verify=False)
  packed += [m.packed is not None for m in gc.get_objects() if isinstance(m, IntegerLinear)]
  gen = torch.Generator().manual_seed(0)
  vocab = model.vocab_size
  prompts = [torch.randint(3, vocab, (int(n),), generator=gen).tolist()
             for n in torch.randint(1, 40, (70,), generator=gen)]
  steps = [torch.randint(0, vocab, (70,), generator=gen).tolist() for _ in range(3)]
  cand = torch.randint(0, vocab, (70, 9), generator=gen)
  for count in counts:
    state = RowDecodeState(prompts=[list(p) for p in prompts[:count]])
    rows = []
    hidden = model.next_hidden(state, None)
    for s in range(len(steps) + 1):
        dense = model.logits_from_hidden(hidden)
        sparse = model.logits_from_hidden(hidden, cand[:count])
        rows.append((hidden, dense, sparse))
        if s < len(steps):
            hidden = model.next_hidden(state, torch.tensor(steps[s][:count]))
    # per row: the digest of its own values only (rows 0-2 are in every count >= 3)
    for r in range(min(count, 3)):
        h = hashlib.sha256()
        for hidden, dense, sparse in rows:
            for t in (hidden[r], dense[r], sparse[r]):
                h.update(t.contiguous().view(torch.int32).numpy().tobytes())
        out[f"{dtype}:{count}:{r}"] = h.hexdigest()
print(json.dumps({"digests": out, "packed": any(packed)}))
'''


def _run(folder: Path, env: dict[str, str], dtype: str = "float32,bfloat16", block: int = 4,
         counts: str = "1,2,3,70") -> dict[str, str]:
    return _probe(folder, env, dtype, block, counts)["digests"]


def _probe(folder: Path, env: dict[str, str], dtype: str = "float32,bfloat16", block: int = 4,
           counts: str = "1,2,3,70") -> dict:
    """The probe's digests of each row and whether any weight was packed for oneDNN
    (dplang.models.packed_int8) in that process."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
                         "DPLANG_THREADS", "OMP_NUM_THREADS", "DPLANG_NO_KERNELS",
                         "DPLANG_NO_PACKED_INT8")}
    full.update(env)
    src = Path(__file__).resolve().parents[2] / "src"
    full["PYTHONPATH"] = os.pathsep.join([str(src), full.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _PROBE, str(folder), dtype, str(block), counts],
                          env=full, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row_digests(result: dict[str, str]) -> dict[str, str]:
    """Each row's digest must not depend on the row count it was decoded with."""
    by_row: dict[str, set[str]] = {}
    for key, digest in result.items():
        dtype, _, row = key.split(":")
        by_row.setdefault(f"{dtype}:{row}", set()).add(digest)
    assert all(len(v) == 1 for v in by_row.values()), by_row
    return {row: next(iter(v)) for row, v in by_row.items()}


REPRESENTATIVE = [
    {"DPLANG_THREADS": "2"},
    {"DPLANG_THREADS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    {"DPLANG_THREADS": "3", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
     "ATEN_CPU_CAPABILITY": "avx2"},
    {"DPLANG_THREADS": "2", "DPLANG_NO_KERNELS": "1", "ATEN_CPU_CAPABILITY": "default"},
    {"DPLANG_THREADS": "1", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI",
     "DPLANG_NO_KERNELS": "1"},
    {"DPLANG_THREADS": "2", "DPLANG_NO_PACKED_INT8": "1"},
]


def test_the_same_bits_on_simulated_machines(tiny_gemma_dir: Path) -> None:
    """Including with and without the weights packed for oneDNN: packed where this CPU has
    VNNI or AMX and oneDNN's ISA is not limited (the first and fourth configurations), never
    under a limit or with the path turned off."""
    from dplang.models import packed_int8

    # two probes at a time (each its own process): the machine's two cores, half the wait
    with ThreadPoolExecutor(max_workers=2) as pool:
        probes = list(pool.map(lambda env: _probe(tiny_gemma_dir, env), REPRESENTATIVE))
    results = [_row_digests(p["digests"]) for p in probes]
    assert len(results[0]) == 6  # three rows, two precisions
    assert all(r == results[0] for r in results[1:]), results
    here = probes[0]["packed"]  # this CPU, undisturbed (whatever this process's own variables)
    if packed_int8._ops_present() and _cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"}:
        assert here
    assert [p["packed"] for p in probes] == [here, False, False, here, False, False]


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in text.splitlines()
                 if line.startswith("flags")), set())


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_whole_matrix(tiny_llama_dir: Path, tiny_gemma_dir: Path, arch: str,
                          skip_capability_this_cpu_lacks) -> None:
    folder = tiny_llama_dir if arch == "llama" else tiny_gemma_dir
    isas = [None, "AVX2", "AVX512_CORE", "AVX512_CORE_VNNI"]
    capabilities = [None, "default", "avx2", "avx512"]
    reference = None
    for isa, capability, threads, kernels in itertools.product(isas, capabilities, ["1", "2", "3"],
                                                               ["0", "1"]):
        env = {"DPLANG_THREADS": threads, "DPLANG_NO_KERNELS": kernels}
        if isa:
            env["ONEDNN_MAX_CPU_ISA"] = isa
        if capability:
            try:
                skip_capability_this_cpu_lacks(capability)
            except pytest.skip.Exception:
                continue  # a machine this CPU cannot simulate
            env["ATEN_CPU_CAPABILITY"] = capability
        digests = _row_digests(_run(folder, env, counts=",".join(
            str(c) for c in range(1, 71, 7))))
        reference = reference or digests
        assert digests == reference, env
