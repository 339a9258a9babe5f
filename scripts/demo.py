"""The quick-start demo (``make demo``): a real private generation.

Runs ``dplang generate`` with the embedded default model (Gemma 3 270M) on the 42 fictional
reviews shipped with dplang, at ε = 10 (δ = 1e-6), B = 7, T = 64 tokens, then prints the texts
and the guarantee. Output goes to ``demo-out/`` (rewritten on each run). The demo ledger is
``demo-out/ledger.sqlite`` so that the demo never touches a user's real ledger. The seed 2026
is written here, hence public: acceptable only because the demo corpus is fictional toy data
(on real data, leave ``--seed`` out: a fresh secret seed is drawn and kept in the private side
file).
"""

from __future__ import annotations

import json
import shutil
import sys
from importlib.resources import files
from pathlib import Path

from dplang.cli.app import main
from dplang.io import demo_corpus_path

OUT_DIR = Path("demo-out")


def run() -> int:
    shutil.rmtree(OUT_DIR, ignore_errors=True)
    OUT_DIR.mkdir()
    template = Path(str(files("dplang") / "data" / "demo_template.toml"))
    out = OUT_DIR / "demo.jsonl"
    code = main([
        "generate", "--data", str(demo_corpus_path()), "--model", "default",
        "--epsilon", "10", "--delta", "1e-6", "--batch-size", "7", "--max-tokens", "64",
        "--temperature", "1.0", "--top-k", "50", "--prompt", str(template),
        "--seed", "2026", "--out", str(out), "--ledger", str(OUT_DIR / "ledger.sqlite"),
    ])  # not --quiet: the plan, a progress bar with its ETA, and each text as it is written
    if code != 0:
        return code
    print("\n=== private synthetic reviews (InvisibleInk, default model) ===")
    for line in out.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        print(f"\n[{rec['group']}] ({rec['num_tokens']} tokens, references "
              f"{rec['reference_ids'][0]}–{rec['reference_ids'][-1]})")
        print(rec["text"].strip())
    manifest = json.loads((OUT_DIR / "demo.manifest.json").read_text())
    print("\n=== guarantee ===")
    print(f"rho={manifest['rho']:.4g} epsilon={manifest['epsilon']:.4g} "
          f"delta={manifest['delta']:g} clip={manifest['clip']:.4g} (summary above)")
    print(f"\nfiles: {out}, {OUT_DIR / 'demo.manifest.json'} (public); "
          f"{OUT_DIR / '.dplang-private' / 'demo.private.json'} (private, mode 600 in a folder "
          "only you can enter: seed, data digest, counts)")
    return 0


if __name__ == "__main__":
    sys.exit(run())
