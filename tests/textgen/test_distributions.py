import numpy as np
import pytest
import torch

from dplang.textgen.distributions import softmax64


def test_softmax64_rows_and_temperature():
    x = torch.tensor([[1.0, 2.0, 3.0], [1000.0, 1000.0, -1000.0]])
    p = softmax64(x, 2.0)
    assert p.dtype == np.float64 and p.shape == (2, 3)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=0, atol=1e-15)
    np.testing.assert_allclose(p[0], torch.softmax(x[0].double() / 2.0, 0).numpy(), rtol=1e-12)
    np.testing.assert_allclose(p[1], [0.5, 0.5, 0.0], atol=1e-300)  # no overflow
    np.testing.assert_allclose(softmax64(x[0]), torch.softmax(x[0].double(), 0).numpy())
    with pytest.raises(ValueError, match="temperature"):
        softmax64(x, 0.0)
