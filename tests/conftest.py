import pytest


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests are skipped where PyTorch sees no CUDA GPU."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _private_ledger(tmp_path_factory, monkeypatch):
    """Never let a test touch the user's real privacy ledger."""
    monkeypatch.setenv("DPLANG_LEDGER", str(tmp_path_factory.mktemp("ledger") / "l.sqlite"))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Llama-architecture model without a chat template (no downloads)."""
    from dplang.models.toy import make_tiny_hf_model

    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny_llama"), arch="llama")


@pytest.fixture(scope="session")
def tiny_gemma_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Gemma 3 model: sliding window 4, soft-capped logits, a chat template."""
    from dplang.models.toy import make_tiny_hf_model

    return make_tiny_hf_model(
        tmp_path_factory.mktemp("tiny_gemma"),
        arch="gemma3",
        chat_template=True,
        sliding_window=4,
        final_logit_softcapping=3.0,
    )
