"""Mutation check: does the test suite catch the privacy mistakes it is meant to catch?

Each mutation below is a small text patch of the source that breaks a privacy property. For
each one the script copies the working tree (tracked and untracked, non-ignored files) to a
scratch directory, applies the patch there — the checkout itself is never modified — runs the
tests named for it with that copy's ``src`` first on the path, and records whether a test
failed (caught) or everything passed (missed). The unmutated copy is run first: it must pass,
otherwise "caught" would mean nothing.

    python scripts/mutation_check.py            # all mutations; exit code 1 if one is missed
    python scripts/mutation_check.py --list     # names and descriptions
    python scripts/mutation_check.py --only kary-half-noise --only bounds-printed-delta

The result is recorded in docs/privacy.md ("Mutation check").
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ENGINE_AUDIT = "tests/textgen/test_engine_audit.py"
NUMERICS = "tests/textgen/test_invisibleink_numerics.py"
RELEASE_AUDIT = "tests/sampling/test_release_path_audit.py"
BATCH = "tests/textgen/test_invisibleink_batch.py"
BATCH_SRC = "src/dplang/textgen/methods/invisibleink_batch.py"
GRAPHS = "tests/models/test_decode_graphs.py"
GRAPHS_SRC = "src/dplang/models/decode_graphs.py"
PACKED = "tests/models/test_packed_int8.py"


@dataclass(frozen=True)
class Mutation:
    """A named patch: each (file, old, new) replaces exactly one occurrence of ``old``."""

    name: str
    description: str
    patches: tuple[tuple[str, str, str], ...]
    tests: tuple[str, ...]


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "public-row-private-prompt-runner",
        "the runner builds each job's public prompt from the first private prompt",
        (("src/dplang/textgen/orchestration.py",
          "return GroupJob(batch.index, public, tuple(private), _shared_prefix(plan, labels, "
          "public))",
          "return GroupJob(batch.index, private[0], tuple(private), _shared_prefix(plan, "
          "labels, public))"),),
        (ENGINE_AUDIT,),
    ),
    Mutation(
        "public-row-private-prompt-engine",
        "the engine decodes the public row from the first private prompt",
        (("src/dplang/textgen/engine.py",
          "            rows_prompts = [*prompts, job.public_prompt]\n",
          "            rows_prompts = [*prompts, job.private_prompts[0]]\n"),),
        (ENGINE_AUDIT,),
    ),
    Mutation(
        "public-prompt-extra-space",
        "the public prompt gets one extra space (no longer the empty reference's prompt)",
        (("src/dplang/textgen/orchestration.py",
          "public = model.render_prompt(template.render(None, labels), template.system)",
          'public = model.render_prompt(template.render(None, labels) + " ", '
          "template.system)"),),
        (ENGINE_AUDIT,),
    ),
    Mutation(
        "kary-half-noise",
        "the discrete k-ary release path (DiscreteLaplaceHistogramSampler.sample) uses half "
        "its noise scale",
        (("src/dplang/sampling/kary.py",
          "return Fraction(2) / Fraction(self.epsilon)",
          "return Fraction(1) / Fraction(self.epsilon)"),),
        (RELEASE_AUDIT,),
    ),
    Mutation(
        "product-half-sigma-phases-0-1",
        "the general product sampler's Gaussian σ is halved in phases 0–1 (orientation, "
        "bucketing)",
        (("src/dplang/sampling/product.py",  # σ ∝ 1/√ρ: 4ρ halves σ
          "est = self._noisy_sum(rows, o0, o1, everything, flips, d, self.rho, rng)",
          "est = self._noisy_sum(rows, o0, o1, everything, flips, d, 4 * self.rho, rng)"),
         ("src/dplang/sampling/product.py",
          "est = self._noisy_sum(rows, start, start + chunk, active, flips, t_r, self.rho,",
          "est = self._noisy_sum(rows, start, start + chunk, active, flips, t_r, 4 * self.rho,"),
         ),
        (RELEASE_AUDIT,),
    ),
    Mutation(
        "product-half-sigma-phase-2",
        "the general product sampler's Gaussian σ is halved in phase 2 (sampling)",
        (("src/dplang/sampling/product.py",  # σ ∝ 1/√ρ: 4ρ halves σ
          "self.threshold(u, cols.size, n, d), rho_b, rng)",
          "self.threshold(u, cols.size, n, d), 4 * rho_b, rng)"),),
        (RELEASE_AUDIT,),
    ),
    Mutation(
        "bounds-printed-delta",
        "sampling/bounds.py uses Theorem 1.8 as printed, √d·ln(1/δ), instead of √(d·ln(1/δ))",
        (("src/dplang/sampling/bounds.py",
          "n_priv = math.ceil(8 * math.sqrt(2 * d * math.log(1 / dl)) / epsilon)",
          "n_priv = math.ceil(8 * math.sqrt(2 * d) * math.log(1 / dl) / epsilon)"),),
        (RELEASE_AUDIT, "tests/sampling/test_sampling_product.py"),
    ),
    # ---- further mistakes of the same kind ----
    Mutation(
        "invisibleink-no-clip",
        "InvisibleInk aggregates the private logits without clipping",
        (("src/dplang/textgen/methods/invisibleink.py",
          "limit = float(max(math.floor(math.ldexp(clip_norm, q)) - 2, 0))",
          "limit = math.inf"),
         ("src/dplang/textgen/methods/invisibleink.py",
          "np.clip(diff, -clip_norm, clip_norm, out=diff)",
          "pass")),
        (ENGINE_AUDIT, NUMERICS),
    ),
    Mutation(
        "invisibleink-divide-by-present-rows",
        "InvisibleInk averages over the non-empty references (m) instead of the public B",
        (("src/dplang/textgen/methods/invisibleink.py",
          "total = total + steps.sum(axis=0)",
          "total = total + steps.sum(axis=0) * batch_size / m"),),
        (ENGINE_AUDIT, NUMERICS),
    ),
    Mutation(
        "invisibleink-nan-not-clipped",
        "a NaN private logit is not mapped into [−C, C] (it aborts the run)",
        (("src/dplang/textgen/methods/invisibleink.py",
          "diff[np.isnan(diff)] = 0.0",
          "pass"),),
        (NUMERICS,),
    ),
    Mutation(
        "invisibleink-float-margin",
        "the fixed-point clip limit is rounded up past C·2^q (the float64 bound exceeds C/B)",
        (("src/dplang/textgen/methods/invisibleink.py",
          "limit = float(max(math.floor(math.ldexp(clip_norm, q)) - 2, 0))",
          "limit = float(max(math.floor(math.ldexp(clip_norm, q)) + 1, 0))"),),
        (NUMERICS,),
    ),
    Mutation(
        "batched-step-no-clip",
        "the batched InvisibleInk step (the engine's path) adds private differences unclipped",
        ((BATCH_SRC,
          "steps = torch.maximum(torch.minimum(steps, limit[own]), -limit[own])",
          "pass"),
         (BATCH_SRC,
          "neginf=-float(clip_norm)).clamp(-clip_norm, clip_norm)",
          "neginf=-float(clip_norm))")),
        (ENGINE_AUDIT, BATCH),
    ),
    Mutation(
        "batched-step-divide-by-present-rows",
        "the batched step averages over each group's non-empty references instead of B",
        ((BATCH_SRC,
          "divisor = torch.full((), float(batch_size), dtype=torch.float64, device=device)",
          "divisor = torch.bincount(owner.to(device), minlength=groups).clamp(min=1)"
          "[:, None].to(torch.float64)"),),
        (ENGINE_AUDIT, BATCH),
    ),
    Mutation(
        "batched-step-grid-of-the-batch",
        "the batched step takes one grid exponent for the whole batch (a group's scores then "
        "depend on the other groups' public logits)",
        ((BATCH_SRC,
          "top = finite.abs().amax(dim=-1) if width",
          "top = finite.abs().amax().expand(groups) if width"),),
        (ENGINE_AUDIT, BATCH),
    ),
    Mutation(
        "batched-step-support-of-the-batch",
        "the batched Top-k+ takes the +inf rule of the whole batch, not of each row",
        ((BATCH_SRC,
          "return torch.where(plus.any(dim=-1, keepdim=True), plus,",
          "return torch.where(plus.any(), plus,"),),
        (ENGINE_AUDIT, BATCH),
    ),
    Mutation(
        "reveal-or-obscure-direct-q",
        "reveal-or-obscure computes q = k/(k + n(e^ε − 1)) directly (0 at ε ≈ 709, overflow "
        "from 710)",
        (("src/dplang/sampling/kary.py", "if epsilon < 600.0:", "if True:"),),
        (RELEASE_AUDIT,),
    ),
    Mutation(
        "report-simultaneous-at-beta",
        "the report's 'simultaneous' bound uses the per-candidate level β instead of β/m",
        (("src/dplang/reports/mechanism.py",
          "test.at_level(config.beta / len(stmts))",
          "test.at_level(config.beta)"),),
        ("tests/reports/test_selection.py",),
    ),
    Mutation(
        "adapmixed-publishes-cost",
        "AdaPMixED writes its exact, data-dependent privacy cost into every record",
        (("src/dplang/textgen/methods/adapmixed.py",
          'return {"private_steps": self.private_steps, "public_steps": self.public_steps}',
          'return {"private_steps": self.private_steps, "public_steps": self.public_steps,\n'
          '                "epsilon_spent": self.p.epsilon_of(self.cost)}'),),
        ("tests/textgen/test_adapmixed.py", "tests/cli/test_generate.py"),
    ),
    Mutation(
        "adapmixed-add-remove",
        "dplang generate offers add-remove adjacency for AdaPMixED again",
        (("src/dplang/textgen/methods/adapmixed.py",
          "adjacencies=(Adjacency.REPLACE_BY_NULL,),",
          "adjacencies=(Adjacency.REPLACE_BY_NULL, Adjacency.ADD_REMOVE),"),),
        ("tests/cli/test_generate.py",),
    ),
    Mutation(
        "amin-svt-query-noise-sigma",
        "Amin et al.'s sparse vector test draws its query noise from Lap(σ) instead of Lap(2σ)",
        (("src/dplang/textgen/methods/amin.py",
          "distance + float(laplace(2.0 * self.sigma, rng))",
          "distance + float(laplace(self.sigma, rng))"),),
        ("tests/textgen/test_amin.py",),
    ),
    Mutation(
        "amin-svt-query-sensitivity-scaled",
        "Amin et al.'s sparse vector test takes its query sensitivity as expm1(Δ/2) instead of "
        "the safe bound (its noise then too small for the charged ρ)",
        (("src/dplang/textgen/methods/amin.py",
          "    return min(2.0, math.expm1(2.0 * delta_inf))",
          "    return min(2.0, math.expm1(0.5 * delta_inf))"),),
        ("tests/textgen/test_amin.py",),
    ),
    Mutation(
        "unproven-accounting-as-dp",
        "a guarantee resting on an unproven assumption (Amin et al.'s paper convention) is "
        "counted as ex-ante DP again (charged under a budget)",
        (("src/dplang/privacy/guarantees.py",
          "        return cls(mechanism, unit, adjacency, None, epsilon, delta, ex_ante=False,\n"
          "                   details={**(details or {}), \"unproven\": assumption})",
          "        return cls(mechanism, unit, adjacency, None, epsilon, delta, ex_ante=True,\n"
          "                   details={**(details or {}), \"unproven\": assumption})"),),
        ("tests/textgen/test_amin.py",),
    ),
    Mutation(
        "numba-attention-score-sum-narrowed",
        "the CPU attention kernel sums a query limb's products with a key in int16 (wraps: "
        "other scores than the definition's exact integers)",
        (("src/dplang/models/_numba_kernels.py",
          "        s = np.int32(s + np.int32(a[c]) * np.int32(b[c]))",
          "        s = np.int16(s + np.int32(a[c]) * np.int32(b[c]))"),),
        ("tests/models/test_cpu_kernels.py",),
    ),
    Mutation(
        "numba-attention-value-chunk-unflushed",
        "the CPU attention kernel's int32 value sums are not added up across chunks (only the "
        "last chunk of positions counts)",
        (("src/dplang/models/_numba_kernels.py",
          "                        acc[j, c] += np.float64(part[j, c])",
          "                        acc[j, c] = np.float64(part[j, c])"),),
        ("tests/models/test_cpu_kernels.py",),
    ),
    Mutation(
        "float32-chunks-too-long",
        "the exact float32 products (the kernel of every CPU without int8 dot products) sum "
        "chunks of 4,096 limb products: partial sums beyond 2**24 are rounded, so a row's "
        "integers are no longer exact (and could depend on the library's summation order)",
        (("src/dplang/models/exact.py",
          "_FLOAT32_CHUNK = 2**24 // (_LIMB_MAX * _LIMB_MAX)",
          "_FLOAT32_CHUNK = 4 * 2**24 // (_LIMB_MAX * _LIMB_MAX)"),),
        ("tests/models/test_transformers_backend.py", "tests/models/test_cpu_kernels.py"),
    ),
    Mutation(
        "weight-products-other-row",
        "the compiled int8 dot products of the LM head's bounds multiply every row's column "
        "by the first row's limbs (another row's data decides a row's candidate set)",
        (("src/dplang/models/_numba_kernels.py",
          "            out[c, r] = exact_dot(weights[c], limbs[r])",
          "            out[c, r] = exact_dot(weights[c], limbs[0])"),),
        ("tests/models/test_cpu_kernels.py", "tests/models/test_top_superset.py"),
    ),
    Mutation(
        "numba-norm-sum-narrowed",
        "the CPU norms' fixed-point sum of squares keeps each rounded term in int32 (wraps: "
        "another norm than the definition's exact sum)",
        (("src/dplang/models/_numba_kernels.py",
          "            itotal += np.int64(np.rint((v * v) * grid))",
          "            itotal += np.int32(np.rint((v * v) * grid))"),),
        ("tests/models/test_cpu_kernels.py",),
    ),
    Mutation(
        "numba-magnitude-keeps-sign",
        "the CPU kernels' largest magnitude of a row keeps the sign bit (a negative extreme "
        "is missed: another rounding scale than the definition's)",
        (("src/dplang/models/_numba_kernels.py",
          "        top = max(top, bits[j] & magnitude_mask32)",
          "        top = max(top, bits[j])"),),
        ("tests/models/test_cpu_kernels.py",),
    ),
    Mutation(
        "numba-residual-reads-first-row",
        "the fused residual kernel adds the first row's residual to every row (a row's "
        "hidden state then depends on another row)",
        (("src/dplang/models/_numba_kernels.py",
          "            h_out[i, j] = h[i, j] + y[j]",
          "            h_out[i, j] = h[0, j] + y[j]"),),
        ("tests/models/test_cpu_kernels.py",),
    ),
    Mutation(
        "numba-gated-up-from-gate",
        "the fused gated kernel multiplies the activation by the gate's own recombination "
        "instead of up's",
        (("src/dplang/models/_numba_kernels.py",
          "            m[j] = (silu32(g) if silu else gelu_tanh32(g)) * u",
          "            m[j] = (silu32(g) if silu else gelu_tanh32(g)) * g"),),
        ("tests/models/test_cpu_kernels.py",),
    ),
    Mutation(
        "numba-qkv-key-stored-unrotated",
        "the fused q/k/v kernel stores a key before its rotation (the stored keys are not the "
        "definition's: every later score differs)",
        (("src/dplang/models/_numba_kernels.py",
          "            store_rounded(rotated, kl, ks_store, k_store, slot, h, pos)",
          "            store_rounded(x, kl, ks_store, k_store, slot, h, pos)"),),
        ("tests/models/test_cpu_kernels.py",),
    ),
    Mutation(
        "numba-largest-score-negatives-unordered",
        "the CPU attention kernel's largest score compares negative scores by their raw bits "
        "(the least negative is not found: other weights than the definition's)",
        (("src/dplang/models/_numba_kernels.py",
          "        key = b if b >= 0 else b ^ magnitude_mask32",
          "        key = b"),),
        ("tests/models/test_cpu_kernels.py",),
    ),
    Mutation(
        "numba-masses-sum-narrowed",
        "the CPU attention kernel's fixed-point denominator keeps each rounded weight in int32 "
        "(wraps: another denominator than the definition's exact sum)",
        (("src/dplang/models/_numba_kernels.py",
          "            itotal += np.int64(np.rint(np.float64(w[p]) * grid))",
          "            itotal += np.int32(np.rint(np.float64(w[p]) * grid))"),),
        ("tests/models/test_cpu_kernels.py",),
    ),
    Mutation(
        "head-bound-range-narrowed",
        "the bounded LM head takes the low-limb weights' products to reach 127 |h| at most "
        "(128 |h| for a negative high limb h): an upper bound below the logit, a kept token "
        "outside the superset",
        (("src/dplang/models/cpu_kernels.py",
          "            (127 * positive + 128 * negative).numpy())",
          "            (127 * positive + 127 * negative).numpy())"),),
        ("tests/models/test_top_superset.py",),
    ),
    Mutation(
        "head-bound-upper-from-lower",
        "the bounded LM head's upper bound is computed from the lowest low-limb product",
        (("src/dplang/models/_numba_kernels.py",
          "            hi = recombined(hh, hl + hi_g, ag, bg, col_scale[col], has_bias, bv)",
          "            hi = recombined(hh, hl + lo_g, ag, bg, col_scale[col], has_bias, bv)"),),
        ("tests/models/test_top_superset.py",),
    ),
    Mutation(
        "head-superset-strict-threshold",
        "the bounded LM head's pass drops columns whose upper bound equals the threshold "
        "(a token tied with the k-th largest logit is lost)",
        (("src/dplang/models/_numba_kernels.py",
          "            if upper[r] >= threshold and not (any_banned and banned[start + r]):",
          "            if upper[r] > threshold and not (any_banned and banned[start + r]):"),),
        ("tests/models/test_top_superset.py",),
    ),
    Mutation(
        "head-superset-compaction-without-margin",
        "when a chunk would not fit, the bounded LM head's pass drops the candidates below the "
        "k-th largest lower bound so far instead of below it minus the margin (kept tokens "
        "within the margin are lost)",
        (("src/dplang/models/_numba_kernels.py",
          "                if cand_upper[g, t] >= threshold:",
          "                if cand_upper[g, t] >= heap[0]:"),),
        ("tests/models/test_top_superset.py",),
    ),
    Mutation(
        "superset-visit-stops-at-ties",
        "the exact logits' visit by decreasing upper bound stops at a candidate whose upper "
        "bound equals f32(e - margin) (a token tied at the rule's threshold is lost)",
        (("src/dplang/models/_numba_kernels.py",
          "            if size == top_k and -neg[s] < f32(heap[0] - m32):",
          "            if size == top_k and -neg[s] <= f32(heap[0] - m32):"),),
        ("tests/models/test_top_superset.py",),
    ),
    Mutation(
        "superset-visit-without-margin",
        "the exact logits' visit stops below the k-th largest exact logit instead of below it "
        "minus the margin (the rule's tokens within the margin are not computed)",
        (("src/dplang/models/_numba_kernels.py",
          "            if size == top_k and -neg[s] < f32(heap[0] - m32):",
          "            if size == top_k and -neg[s] < heap[0]:"),),
        ("tests/models/test_top_superset.py",),
    ),
    Mutation(
        "superset-padding-counted",
        "the batched step applies the Top-k+ rule to a superset's padded columns too (the "
        "padding repeats a candidate: it is counted twice)",
        ((BATCH_SRC,
          "        values = logits.masked_fill(outside, -math.inf)  # the padding repeats a "
          "candidate",
          "        values = logits"),),
        (BATCH,),
    ),
    Mutation(
        "superset-margin-unrounded",
        "the engine asks for a superset with a smaller margin than the rule's (1.5 C/B)",
        (("src/dplang/textgen/engine.py",
          "        margin = float(np.float32(2.0 * settings.clip_norm / settings.batch_size))",
          "        margin = 1.5 * settings.clip_norm / settings.batch_size"),),
        (BATCH,),
    ),
    Mutation(
        "triton-round-drops-sign",
        "the Triton kernels round to even without putting the sign back (round(-0.3) = +0.0, "
        "not torch's -0.0): other bits than the definition's",
        (("src/dplang/models/kernels/triton_exact.py",
          "    return (mag.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)",
          "    return mag"),),
        ("tests/models/test_triton_kernels.py",),
    ),
    Mutation(
        "triton-limb-split-off-by-one",
        "the Triton kernels split a 15-bit integer into limbs with the wrong offset",
        (("src/dplang/models/kernels/triton_exact.py",
          "        hi = (qi + 128) >> 8",
          "        hi = (qi + 127) >> 8"),),
        ("tests/models/test_triton_kernels.py",),
    ),
    Mutation(
        "triton-attention-counts-unrounded",
        "the Triton attention kernel multiplies the values by unrounded masses instead of "
        "their integer counts (sums no longer exact: other bits, order-dependent on a GPU)",
        (("src/dplang/models/kernels/triton_exact.py",
          "        count = (m * factor + 12582912.0) - 12582912.0",
          "        count = m * factor"),),
        ("tests/models/test_triton_kernels.py",),
    ),
    Mutation(
        "triton-gathered-head-neighbour-scale",
        "the Triton gathered LM head scales every row's outputs by the first row's scale (a "
        "row's logits then depend on another row: another group's data)",
        (("src/dplang/models/kernels/triton_exact.py",
          "    rs = tl.load(rscale_ptr + i)\n",
          "    rs = tl.load(rscale_ptr + 0)\n"),),
        ("tests/models/test_triton_kernels.py",),
    ),
    Mutation(
        "packed-int8-rounded-output",
        "the prepacked int8 products come back in bfloat16 (the integers rounded: other bits "
        "than torch._int_mm's exact sums)",
        (("src/dplang/models/packed_int8.py",
          "            None, 1.0, 0, torch.float32, \"none\", [], \"\")",
          "            None, 1.0, 0, torch.bfloat16, \"none\", [], \"\").float()"),),
        (PACKED,),
    ),
    Mutation(
        "packed-int8-probe-skipped",
        "the admission of prepacked int8 products never runs its probe (a kernel wrong at "
        "some row count would be used)",
        (("src/dplang/models/packed_int8.py",
          "            for m in rows:",
          "            for m in rows[:0]:"),),
        (PACKED,),
    ),
    Mutation(
        "packed-int8-isa-limit-ignored",
        "the prepacked int8 products are used although ONEDNN_MAX_CPU_ISA limits oneDNN (below "
        "VNNI they were seen wrong)",
        (("src/dplang/models/packed_int8.py",
          "        if os.environ.get(var, \"\").strip().upper() not in (\"\", \"ALL\", "
          "\"DEFAULT\"):",
          "        if False:"),),
        (PACKED,),
    ),
    Mutation(
        "packed-int8-record-without-cpu",
        "a passed admission probe of the prepacked int8 products is reused on another CPU (its "
        "record's key leaves the CPU out)",
        (("src/dplang/models/packed_int8.py",
          "                       \"cpu\": records.cpu_identity(), ",
          "                       \"cpu\": \"\", "),),
        (PACKED,),
    ),
    Mutation(
        "invariance-record-damaged-is-pass",
        "a row-invariance record that does not say it passed (truncated, foreign) counts as a "
        "pass with the fast arithmetic",
        (("src/dplang/models/invariance.py",
          '    if info.get("verified") is True and info.get("arithmetic") in RECORDED_ARITHMETICS:',
          '    if record.is_file():'),),
        ("tests/models/test_invariance_record.py",),
    ),
    Mutation(
        "augpe-sigma-one-iteration",
        "Aug-PE's histograms get noise σ/√T (calibrated for one of its T iterations)",
        (("src/dplang/textgen/methods/augpe.py",
          "    sigma = params.sigma\n",
          "    sigma = params.sigma / math.sqrt(params.iterations)\n"),),
        ("tests/textgen/test_augpe.py",),
    ),
    Mutation(
        "amin-float-margin",
        "Amin et al.'s fixed-point clip limit is rounded up past C·2^q (the float64 aggregate "
        "exceeds 2C/B)",
        (("src/dplang/textgen/methods/amin.py",
          "limit = float(max(math.floor(math.ldexp(clip, q)) - 1, 0))",
          "limit = float(max(math.ceil(math.ldexp(clip, q)) + 1, 0))"),),
        ("tests/textgen/test_amin.py",),
    ),
    Mutation(
        "stream-root-is-the-seed",
        "a release's random streams are rooted at its seed instead of H(seed, release id): two "
        "releases made with one seed share their noise",
        (("src/dplang/release.py",
          "        return make_stream_seed(self.seed, self.release_id, self.coupling)",
          "        return self.seed"),),
        ("tests/test_seeds.py",),
    ),
    Mutation(
        "side-file-beside-output",
        "private side files are written beside their output again, where anyone who may "
        "search the folder can stat their size",
        (("src/dplang/release.py",
          "                   output.parent / PRIVATE_DIR / (stem + PRIVATE_SUFFIX),",
          "                   output.parent / (stem + PRIVATE_SUFFIX),"),),
        ("tests/test_private_files.py",),
    ),
    Mutation(
        "calibration-unsafe-end",
        "the one calibrator returns the end of its final bracket where the target fails (a "
        "noise scale one step too small, a ρ one step too large)",
        (("src/dplang/privacy/calibration.py",
          "    return hi if above else lo\n",
          "    return lo if above else hi\n"),),
        ("tests/privacy/test_calibration.py",),
    ),
    Mutation(
        "zcdp-target-unchecked",
        "Guarantee.zcdp prints a target ε without checking that ρ implies it",
        (("src/dplang/privacy/guarantees.py",
          "        elif not rho_to_delta(rho, epsilon) <= delta:\n",
          "        elif False:\n"),),
        ("tests/privacy/test_guarantees.py",),
    ),
    Mutation(
        "data-dependent-says-dp",
        "a data-dependent guarantee is printed as '(ε, δ)-differential privacy'",
        (("src/dplang/privacy/guarantees.py",
          "        if not self.ex_ante:\n",
          "        if False:\n"),),
        ("tests/privacy/test_guarantees.py", "tests/textgen/test_adapmixed.py"),
    ),
    Mutation(
        "graph-padding-in-a-row-slot",
        "a decode graph's padding tokens are written into the first row's slot, not their own",
        ((GRAPHS_SRC,
          "*slots, *[self.pad_slot] * pad,",
          "*slots, *[slots[0]] * pad,"),),
        (GRAPHS,),
    ),
    Mutation(
        "graph-replay-unchecked",
        "a decode graph's replays are not compared with the eager call it was recorded from",
        ((GRAPHS_SRC,
          "            if not same:",
          "            if False:"),),
        (GRAPHS,),
    ),
    Mutation(
        "report-continuous-half-noise",
        "the report's Laplace and Gaussian support tests draw half their calibrated noise "
        "(twice the privacy loss printed)",
        (("src/dplang/reports/noise.py",
          "            return float(laplace(self.scale, rng))",
          "            return float(laplace(self.scale / 2, rng))"),
         ("src/dplang/reports/noise.py",
          "        return float(gaussian(self.scale, rng))",
          "        return float(gaussian(self.scale / 2, rng))")),
        ("tests/reports/test_noise.py",),
    ),
    Mutation(
        "marginal-samplers-half-noise",
        "the Laplace and Gaussian marginal samplers' release draws use half their noise scale",
        (("src/dplang/sampling/product.py",
          "laplace_noisy_sum(arr.mean(axis=0), self.noise_scale(n, d), rng)",
          "laplace_noisy_sum(arr.mean(axis=0), self.noise_scale(n, d) / 2, rng)"),
         ("src/dplang/sampling/product.py",
          "gaussian_noisy_sum(arr.mean(axis=0), self.sigma(n, d), rng)",
          "gaussian_noisy_sum(arr.mean(axis=0), self.sigma(n, d) / 2, rng)")),
        ("tests/sampling/test_sampling_product.py",),
    ),
    Mutation(
        "ledger-delta-counted-twice",
        "the ledger converts the zCDP spend at the whole δ, not at the δ the approximate "
        "releases left (their δ then counts twice: a total over the budget's δ)",
        (("src/dplang/privacy/ledger.py",
          "        return rho_to_epsilon(self.rho, remaining) + self.approx_epsilon",
          "        return rho_to_epsilon(self.rho, delta) + self.approx_epsilon"),),
        ("tests/privacy/test_ledger.py",),
    ),
    Mutation(
        "ledger-budget-not-enforced",
        "the ledger records a release whatever the dataset's budget (the total is compared "
        "with infinity)",
        (("src/dplang/privacy/ledger.py",
          "        if total > budget[0] * (1 + 1e-12):",
          "        if total > math.inf:"),),
        ("tests/privacy/test_ledger.py",),
    ),
    Mutation(
        "sweep-budget-checks-first-cell-only",
        "a set of releases (an experiment's cells) is checked against the budget by its first "
        "release alone: the sweep is charged and published cell by cell until the budget "
        "stops it halfway",
        (("src/dplang/privacy/ledger.py",
          "            self._refuse_over_budget(db, dataset, list(guarantees))",
          "            self._refuse_over_budget(db, dataset, list(guarantees)[:1])"),),
        ("tests/privacy/test_ledger.py", "tests/experiments/test_experiment.py"),
    ),
    Mutation(
        "warning-raises-after-charge",
        "dplang's warnings go through warnings.warn as they are: under -W error the warning "
        "that no row holds a usable reference (after the charge) ends the run unpublished, "
        "on one record's account",
        (("src/dplang/notices.py",
          "    except Warning:\n",
          "    except ZeroDivisionError:\n"),),
        ("tests/api/test_api_edges.py",),
    ),
    Mutation(
        "reference-tokenized-whole",
        "a reference is tokenized whole before it is cut to max_reference_tokens (the planning "
        "time, which the lock file's and the manifest's times show, then measures one "
        "reference's length)",
        (("src/dplang/models/base.py",
          "    head = text[:4 * (max_tokens + 1) * chars]\n",
          "    head = text\n"),),
        ("tests/textgen/test_reference_prefix.py",),
    ),
    Mutation(
        "report-judge-by-path-only",
        "the entailment judge is named by its path only: a judge changed in place is the same "
        "release (a free rerun with the same noise)",
        (("src/dplang/reports/predicates.py",
          '                             "model_sha256": self.model_sha256}',
          "                             }"),),
        ("tests/reports/test_cli_report.py", "tests/reports/test_predicates.py"),
    ),
    Mutation(
        "formal-collection-by-name-only",
        "a formal --data release names its collection by name and size only: a collection "
        "edited in place is the same release",
        (("src/dplang/formal/release.py",
          '                   "collection_sha256": collection_digest(collection),\n',
          ""),),
        ("tests/formal/test_cli.py",),
    ),
    Mutation(
        "exact-division-by-host-number",
        "the quantizer divides by its levels as a host number (on a GPU a multiplication by "
        "the rounded reciprocal: other bits than the CPU's and the Triton kernels')",
        (("src/dplang/models/exact.py",
          "    scale = divide(amax, levels)",
          "    scale = amax / levels"),),
        ("tests/models/test_cuda_semantics.py",),
    ),
    Mutation(
        "generate-model-files-unnamed",
        "generate's fingerprint names the model's weight files only: a model whose config or "
        "tokenizer changed in place is the same release (charged once, other texts)",
        (("src/dplang/textgen/orchestration.py",
          '        "model_files_sha256": (plan.model.support_digest()\n',
          '        "model_files_sha256": (None and plan.model.support_digest()\n'),),
        ("tests/cli/test_limits.py",),
    ),
    Mutation(
        "model-folders-published",
        "public files name a model by its path as given: the folders above it (the data "
        "holder's file layout) reach the manifest",
        (("src/dplang/models/base.py",
          "    name = path.name\n",
          "    name = str(path)\n"),),
        ("tests/cli/test_generate_model_names.py",),
    ),
    Mutation(
        "source-digest-published",
        "the data file's digest a sweep gives each cell's release (for the ledger) is a "
        "fingerprinted request field: it reaches every cell's public manifest",
        (("src/dplang/textgen/orchestration.py",
          '"data_source_digest", "continue_release")',
          '"continue_release")'),),
        ("tests/experiments/test_experiment.py",),
    ),
    Mutation(
        "missing-weights-loaded",
        "a checkpoint missing some weights loads them random (another model at every load)",
        (("src/dplang/models/hf_loading.py",
          "    if missing:  # transformers fills them",
          "    if False:  # transformers fills them"),),
        ("tests/models/test_transformers_backend.py",),
    ),
)


def _copy_tree(dest: Path) -> None:
    """Tracked and untracked, non-ignored files of the working tree (as they are now)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def _run_tests(copy: Path, tests: tuple[str, ...], python: str) -> tuple[int, str, float]:
    env = dict(os.environ, PYTHONPATH=str(copy / "src"), PYTHONDONTWRITEBYTECODE="1")
    started = time.perf_counter()
    proc = subprocess.run([python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           *tests], cwd=copy, env=env, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - started


def _first_failure(output: str) -> str:
    match = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    return match.group(1) if match else "?"


def _apply(copy: Path, mutation: Mutation) -> dict[Path, str]:
    originals: dict[Path, str] = {}
    for rel, old, new in mutation.patches:
        path = copy / rel
        current = path.read_text(encoding="utf-8")
        originals.setdefault(path, current)
        found = current.count(old)
        if found != 1:
            raise SystemExit(f"{mutation.name}: expected one occurrence of {old!r} in {rel}, "
                             f"found {found} (the source changed: update the mutation)")
        path.write_text(current.replace(old, new), encoding="utf-8")
    return originals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--only", action="append", default=[], help="run this mutation only "
                        "(repeatable)")
    parser.add_argument("--python", default=sys.executable, help="interpreter running pytest")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    unknown = set(args.only) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name}: {m.description}")
        return 0
    with tempfile.TemporaryDirectory(prefix="dplang-mutation-") as tmp:
        copy = Path(tmp) / "repo"
        _copy_tree(copy)
        all_tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        code, output, seconds = _run_tests(copy, all_tests, args.python)
        if code != 0:
            print(output[-3000:])
            print(f"the unmutated tree fails its tests (exit {code}): nothing to check")
            return 2
        print(f"unmutated tree: {len(all_tests)} test files pass ({seconds:.0f} s)\n")
        print("| mutation | result | first failing test | s |")
        print("|---|---|---|---|")
        missed = []
        for m in chosen:
            originals = _apply(copy, m)
            try:
                code, output, seconds = _run_tests(copy, m.tests, args.python)
            finally:
                for path, text in originals.items():
                    path.write_text(text, encoding="utf-8")
            caught = code == 1  # 1: tests failed; 2+: collection error or interruption
            if code not in (0, 1):
                print(output[-2000:], file=sys.stderr)
            result = "caught" if caught else ("MISSED" if code == 0 else f"error ({code})")
            if not caught:
                missed.append(m.name)
            failing = _first_failure(output) if caught else "—"
            print(f"| `{m.name}`: {m.description} | {result} | `{failing}` | {seconds:.0f} |",
                  flush=True)
        print(f"\n{len(chosen) - len(missed)} of {len(chosen)} mutations caught"
              + (f"; missed: {', '.join(missed)}" if missed else ""))
        return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
