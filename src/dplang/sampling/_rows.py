"""The rows behind :class:`~dplang.sampling.product.BucketedProductSampler`: a sparse 0/1 matrix
(:class:`SparseBinaryRows`) and one operation on dense or sparse rows, the truncated column sums
after flipping (``_Rows.truncated_sums``) that every NOISYSUM perturbs.

Privacy contract: containers and a deterministic query on the (private) rows; they release
nothing. The sampler adds the noise (:func:`dplang.privacy.mechanisms.gaussian_noisy_sum`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import as_binary_matrix

__all__ = ["SparseBinaryRows"]


@dataclass(frozen=True)
class SparseBinaryRows:
    """An (n, d) 0/1 matrix stored row by row as the column indices of its ones (CSR without
    values): ``indices[indptr[i]:indptr[i+1]]`` are the ones of row i.

    Lets :class:`BucketedProductSampler` run on sparse data (e.g. d in the thousands with a
    few ones per row) with exactly the same result as on the dense matrix.

    Privacy contract: a container — it holds the (private) data itself."""

    indptr: np.ndarray
    indices: np.ndarray
    shape: tuple[int, int]

    @classmethod
    def from_dense(cls, x: np.ndarray) -> SparseBinaryRows:
        arr = as_binary_matrix(x)
        r, c = np.nonzero(arr)
        indptr = np.zeros(arr.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(r, minlength=arr.shape[0]), out=indptr[1:])
        return cls(indptr, c.astype(np.int64), (int(arr.shape[0]), int(arr.shape[1])))

    @classmethod
    def random(cls, p: np.ndarray, n: int, rng: np.random.Generator) -> SparseBinaryRows:
        """n i.i.d. rows of the product ⊗Ber(p_j), generated column by column: column j has
        Bin(n, p_j) ones at uniformly random distinct rows (exactly the product law)."""
        p = np.asarray(p, dtype=np.float64)
        rows_list, cols_list = [], []
        counts = rng.binomial(n, p)
        for j in np.flatnonzero(counts):
            rows_list.append(rng.choice(n, size=int(counts[j]), replace=False))
            cols_list.append(np.full(int(counts[j]), j, dtype=np.int64))
        r = np.concatenate(rows_list) if rows_list else np.zeros(0, dtype=np.int64)
        c = np.concatenate(cols_list) if cols_list else np.zeros(0, dtype=np.int64)
        order = np.lexsort((c, r))
        r, c = r[order], c[order]
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(r, minlength=n), out=indptr[1:])
        return cls(indptr, c, (int(n), int(p.shape[0])))

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=np.uint8)
        rows = np.repeat(np.arange(self.shape[0]), np.diff(self.indptr))
        out[rows, self.indices] = 1
        return out


class _Rows:
    """Dense or sparse rows behind one operation: truncated column sums after flipping."""

    def __init__(self, x: np.ndarray | SparseBinaryRows) -> None:
        if isinstance(x, SparseBinaryRows):
            self.sparse: SparseBinaryRows | None = x
            self.dense = None
            self.shape = x.shape
        else:
            self.sparse = None
            self.dense = as_binary_matrix(x)
            self.shape = (int(self.dense.shape[0]), int(self.dense.shape[1]))

    def truncated_sums(self, start: int, stop: int, cols: np.ndarray, flips: np.ndarray,
                       threshold: int) -> np.ndarray:
        """Column sums over rows [start, stop) of X[:, cols] ⊕ flips[cols], after zeroing every
        row with more than ``threshold`` ones among ``cols``."""
        f = flips[cols]
        if self.dense is not None:
            y = self.dense[start:stop][:, cols] ^ f.astype(np.uint8)
            kept = y[y.sum(axis=1) <= threshold]
            return kept.sum(axis=0, dtype=np.float64)
        sp = self.sparse
        assert sp is not None
        lo, hi = sp.indptr[start], sp.indptr[stop]
        cols_of = sp.indices[lo:hi]
        row_of = np.repeat(np.arange(stop - start), np.diff(sp.indptr[start:stop + 1]))
        position = np.full(sp.shape[1], -1, dtype=np.int64)
        position[cols] = np.arange(cols.size)
        pos = position[cols_of]
        inside = pos >= 0
        pos, row_in = pos[inside], row_of[inside]
        flipped = f[pos]
        m = stop - start
        # ones of row i among cols after flipping: unflipped ones + (flipped cols − their ones)
        plain = np.bincount(row_in[~flipped], minlength=m)
        ones_in_flipped = np.bincount(row_in[flipped], minlength=m)
        count = plain + int(f.sum()) - ones_in_flipped
        kept = count <= threshold
        keep_entry = kept[row_in]
        raw = np.bincount(pos[keep_entry], minlength=cols.size).astype(np.float64)
        return np.where(f, float(kept.sum()) - raw, raw)
