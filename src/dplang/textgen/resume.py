"""What an output folder already holds, and whether a run may continue it (resume rules).

A run's output ``OUT.jsonl`` sits beside its public manifest ``OUT.manifest.json`` and the
folder ``.dplang-private`` (mode 700) that holds its private side file ``OUT.private.json``
(mode 600: the secret seed, data path and digest): :class:`dplang.release.OutputPaths`.
:func:`check_existing` decides, before anything is charged or written, whether a request is
the same run (resume with the stored seed), a new one (nothing there) or a different one
(refused, naming what differs, unless ``--overwrite``); :func:`truncate_to_finished_groups`
cuts a torn last line off the output (a write killed midway) and returns the groups it holds.
A run's side file is written before its charge (its ``stage`` is then ``"opened"``), so a run
stopped inside the charge, or before its manifest, keeps its seed: the same command continues
it, charged once. An ``--overwrite`` of an existing run writes it beside the earlier run's files
instead (``.dplang-private/NAME.EXT.replacing.json``, :attr:`OutputPaths.replacement`), and it
takes the side file's place right after the charge; ``--overwrite`` continues this very run
when it was stopped before its first text (:func:`check_existing`).

Privacy contract: reads the data holder's own files and prints only to the data holder; the
messages name which private field differs (path, content, dataset name), never its value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..models.base import public_model_name
from ..privacy.ledger import PrivacyLedger
from ..release import OPENED_STAGE, OutputPaths, ledger_name
from .errors import GenerationError

if TYPE_CHECKING:
    from .request import GenerationRequest

__all__ = ["Existing", "KeptRun", "check_existing", "continued_run", "differences", "is_opening",
           "kept_openings", "read_record", "stored_fingerprint", "truncate_to_finished_groups"]


def truncate_to_finished_groups(out: Path) -> set[int]:
    """Truncate ``out`` to its whole lines and return the groups they hold: a torn last line
    (a write killed midway), or anything after the first line that is not a finished group,
    is cut off the file. A missing file holds none."""
    if not out.exists():
        return set()
    done: set[int] = set()
    good_bytes = 0
    with open(out, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break
            try:
                done.add(int(json.loads(line)["group"]))
            except (ValueError, KeyError, TypeError):
                break
            good_bytes += len(line)
    if good_bytes != out.stat().st_size:
        with open(out, "r+b") as fh:
            fh.truncate(good_bytes)
    return done


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GenerationError(f"cannot read {path}: {exc}") from None


def differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """``key: old → new`` for the leaves that differ between two JSON-like values."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            out += differences(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    if old == new:
        return []
    return [f"{prefix.rstrip('.')}: {old!r} → {new!r}"]


def _as_now(fingerprint: Any) -> Any:
    """A fingerprint with its model named as this version names it: older versions recorded a
    model by its path as typed (``parameters.model``, ``model_id``), this one by its name
    (:func:`~dplang.models.base.public_model_name`). Applied to both sides of a comparison;
    the digests still tell models apart."""
    if not isinstance(fingerprint, dict):
        return fingerprint
    fp = dict(fingerprint)
    params = fp.get("parameters")
    if isinstance(params, dict) and isinstance(params.get("model"), str):
        fp["parameters"] = {**params, "model": public_model_name(params["model"])}
    if isinstance(fp.get("model_id"), str):
        fp["model_id"] = public_model_name(fp["model_id"])
    return fp


def _fingerprint_differences(stored: dict[str, Any], parameters: dict[str, Any],
                             fingerprint: dict[str, Any] | None) -> list[str]:
    """What differs between a stored fingerprint (already :func:`_as_now`) and the request's
    public ``parameters``, and its whole ``fingerprint`` when the model has loaded."""
    diff = differences(stored.get("parameters"),
                       _as_now({"parameters": parameters})["parameters"])
    if fingerprint is not None:
        diff += differences({k: v for k, v in stored.items() if k != "parameters"},
                            {k: v for k, v in _as_now(fingerprint).items()
                             if k != "parameters"})
    return diff


def _shown(diff: list[str]) -> str:
    """The first three differences, and how many more."""
    return "; ".join(diff[:3]) + (f"; and {len(diff) - 3} more" if len(diff) > 3 else "")


def stored_fingerprint(out: Path) -> dict[str, Any] | None:
    """The public fingerprint of the run ``out`` holds (its manifest's, or its opening side
    file's), which a resumed run keeps: equal to the request's up to how an older version
    named the model, and part of the release id the ledger knows."""
    paths = OutputPaths.of(out)
    for path in (paths.find_manifest(), paths.find_private()):
        if path.exists():
            record = _read_json(path)
            fp = record.get("fingerprint") if isinstance(record, dict) else None
            if isinstance(fp, dict):
                return fp
    return None


def _different_run(req: GenerationRequest, detail: str = "") -> GenerationError:
    return GenerationError(
        f"{req.out} holds a different run{detail}; choose another --out, or --overwrite to "
        "replace it with a new run")


_PRIVATE_NAMES = {"path": "data path", "sha256": "data content", "dataset": "dataset name"}


def _other_private(private_path: Path, private_fp: dict[str, Any]) -> str:
    """Which of the data path, the data's content and the dataset name differ from what the
    run in ``--out`` recorded (names only, never the values: the data holder's terminal), or
    "" when none does or nothing is recorded."""
    if not private_path.exists():
        return ""
    private = _read_json(private_path)
    data = private.get("data") or {}
    stored = {"path": data.get("path"), "sha256": data.get("sha256"),
              "dataset": private.get("dataset")}
    return ", ".join(_PRIVATE_NAMES[k] for k in ("path", "sha256", "dataset")
                     if not _same(k, stored[k], private_fp.get(k)))


def _same(key: str, stored: Any, given: Any) -> bool:
    """Whether a recorded identity value is the given one; a data path as the file it names
    (``a.csv`` from its folder is ``/abs/a.csv``)."""
    if stored == given:
        return True
    if key != "path" or not isinstance(stored, str) or not isinstance(given, str):
        return False
    try:
        return Path(stored).expanduser().resolve() == Path(given).expanduser().resolve()
    except (OSError, RuntimeError):
        return False


def _opening(private_path: Path) -> dict[str, Any] | None:
    """The side file's record when it was written before its run's charge (an opening:
    :meth:`~dplang.release.Release.opening_record`), else None."""
    record = _read_json(private_path)
    return record if isinstance(record, dict) and record.get("stage") == OPENED_STAGE else None


def is_opening(private_path: Path) -> bool:
    """Whether ``private_path`` is a side file written before its run's charge (False when
    it is absent or unreadable)."""
    record = read_record(private_path)
    return record is not None and record.get("stage") == OPENED_STAGE


def _compared(req: GenerationRequest, record: dict[str, Any], fp: Any, path: Path,
              parameters: dict[str, Any], private_fp: dict[str, Any],
              fingerprint: dict[str, Any] | None) -> tuple[int | None, list[str], str]:
    """A kept run against the request: its seed (None when ``record`` holds none), what
    differs in its public fingerprint ``fp`` (and ``--seed``, when given and another), and
    which private identities of its side file ``path`` differ (:func:`_other_private`)."""
    try:
        seed: int | None = int(record["seed"])
    except (KeyError, TypeError, ValueError):
        seed = None
    fp = _as_now(fp)
    diff = _fingerprint_differences(fp if isinstance(fp, dict) else {}, parameters, fingerprint)
    if req.seed is not None and req.seed != seed:
        diff.append("--seed")
    return seed, diff, _other_private(path, private_fp)


def _continue_opening(
    req: GenerationRequest, private_path: Path, opening: dict[str, Any],
    parameters: dict[str, Any], private_fp: dict[str, Any], fingerprint: dict[str, Any] | None,
) -> tuple[bool, int | None]:
    """What to do with the side file of a run stopped before it wrote its manifest (inside
    its charge, or right after it): the same run continues with its seed (charged once); a
    different run replaces it when the ledger does not hold its release (nothing was charged
    or published with that seed), and is refused when it does (its seed would be lost)."""
    seed, diff, other = _compared(req, opening, opening.get("fingerprint"), private_path,
                                  parameters, private_fp, fingerprint)
    if seed is None:
        raise GenerationError(f"cannot resume {req.out}: {private_path} holds no seed")
    if not diff and not other:
        return True, seed
    what = "; ".join(x for x in (_shown(diff), f"other {other}" if other else "") if x)
    release_id = opening.get("release_id")
    charged_to = opening.get("ledger")
    asked = ledger_name(req.ledger)  # (creates nothing)
    if charged_to is not None and not _same("path", charged_to, asked):
        raise GenerationError(
            f"{private_path} holds the seed of a different run ({what}) that was stopped "
            f"inside or right after its charge to the ledger {charged_to}, not this run's "
            f"{asked} (which cannot tell whether it was charged); run its command again to "
            "continue it, or --overwrite (or delete it) to start a new run (a new seed, "
            "charged anew)")
    if not isinstance(release_id, str) or not PrivacyLedger(req.ledger).has_release(release_id):
        return False, None  # never charged, nothing published: the new run replaces it
    raise GenerationError(
        f"{private_path} holds the seed of a different run ({what}) that was charged but "
        "stopped before its first public file; run its command again to continue it (no new "
        "charge), or --overwrite (or delete it) to start a new run (a new seed, charged anew)")


class KeptRun(NamedTuple):
    """This very run, kept from before its first text (:func:`continued_run`): its seed, its
    public fingerprint (part of its release id) and its release id."""

    seed: int
    fingerprint: dict[str, Any]
    release_id: str | None


def continued_run(req: GenerationRequest, parameters: dict[str, Any],
                  private_fp: dict[str, Any],
                  fingerprint: dict[str, Any] | None = None) -> KeptRun | None:
    """With ``--overwrite``: this very run when it was stopped before its first text — its
    opening (:func:`kept_openings`), or its manifest and side file with no text written yet —
    so that "the same command again" continues it with its seed and fingerprint (the
    release the ledger may hold), charged once: a new seed would be a second charge for the
    same texts. None otherwise: whatever else is there is replaced by a new run. The run is
    the one whose record matches the request (:func:`_compared`), never another found by
    its seed alone (two runs may share a given ``--seed``)."""
    paths = OutputPaths.of(req.out)

    def matching(record: dict[str, Any], fp: Any, path: Path) -> KeptRun | None:
        seed, diff, other = _compared(req, record, fp, path, parameters, private_fp,
                                      fingerprint)
        if seed is None or diff or other or not isinstance(fp, dict):
            return None
        release_id = record.get("release_id")
        return KeptRun(seed, fp, release_id if isinstance(release_id, str) else None)

    for path, opening in kept_openings(paths):
        kept = matching(opening, opening.get("fingerprint"), path)
        if kept is not None:
            return kept
    if paths.output.exists() or paths.partial.exists():
        return None  # texts were written (or are being): an --overwrite is a new run
    manifest, private = read_record(paths.find_manifest()), read_record(paths.find_private())
    if manifest is None or private is None or manifest.get("status") == "complete":
        return None  # (a complete run whose texts were deleted: --overwrite is a new run)
    return matching(private, manifest.get("fingerprint"), paths.find_private())


def read_record(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is absent, unreadable or not an object."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def kept_openings(paths: OutputPaths) -> list[tuple[Path, dict[str, Any]]]:
    """The openings kept for the output ``paths`` (records written before a charge, with
    the seed: ``"stage": "opened"``): the replacement of an earlier run's files
    (``--overwrite``), then the side file; each with its path."""
    found = []
    for path in (paths.replacement, paths.private):
        record = read_record(path)
        if record is not None and record.get("stage") == OPENED_STAGE:
            found.append((path, record))
    return found


class Existing(NamedTuple):
    """What :func:`check_existing` found in ``--out`` for a request."""

    #: The run there is this one, to be resumed in place.
    resuming: bool
    #: The seed to use (a resumed run's, or a continued one's); None: a new seed.
    seed: int | None
    #: The public fingerprint the run keeps (part of its release id): a resumed run's stored
    #: one, a continued run's own; equal to the request's up to how an older dplang named
    #: things. None for a new run.
    fingerprint: dict[str, Any] | None


def check_existing(
    req: GenerationRequest, parameters: dict[str, Any], private_fp: dict[str, Any],
    fingerprint: dict[str, Any] | None = None,
) -> Existing:
    """What ``--out`` already holds for this request (:class:`Existing`), after checking it.

    Called twice: before the model load with the public ``parameters`` only, and after it
    with the whole public ``fingerprint`` (model digest and prompt form included). With
    ``--overwrite`` whatever is there is to be replaced: a new run; but when it is this very
    run, stopped before its first text (its opening kept, or its manifest and side file
    written and no text yet), it is continued with its seed and fingerprint (not resumed:
    its files are replaced), so that it is charged once. Refused with a
    one-line error: an output without its manifest; a manifest of a different run (the
    message names what differs); a run whose private side file is gone; a private side file
    left without its run's outputs (a stale seed is never half-used). A side file written
    before its run's charge, with no manifest yet (a run stopped inside its charge or right
    after it), is continued by the same run, replaced by a different one when the ledger
    does not hold its release, and refused otherwise. A side file left without outputs beside
    a replacement (an ``--overwrite`` stopped while it replaced them) is refused with the
    advice to rerun that command with ``--overwrite``."""
    if req.overwrite:
        kept = continued_run(req, parameters, private_fp, fingerprint)
        if req.continue_release is not None and (kept is None
                                                 or kept.release_id != req.continue_release):
            raise GenerationError(
                f"{req.out}: the interrupted run to continue is not this one any more (the "
                "model, its libraries or the prompt changed since it was charged); --overwrite "
                "to generate it anew (a new release, charged anew)")
        return (Existing(False, None, None) if kept is None
                else Existing(False, kept.seed, kept.fingerprint))
    resuming, seed = _check_in_place(req, parameters, private_fp, fingerprint)
    return Existing(resuming, seed, stored_fingerprint(req.out) if resuming else None)


def _check_in_place(
    req: GenerationRequest, parameters: dict[str, Any], private_fp: dict[str, Any],
    fingerprint: dict[str, Any] | None,
) -> tuple[bool, int | None]:
    """:func:`check_existing` without ``--overwrite``: (resuming, stored seed), or refused."""
    paths = OutputPaths.of(req.out)
    manifest_path = paths.find_manifest()
    private_path = paths.find_private()  # an older run's may be beside the output
    if not manifest_path.exists():
        if req.out.exists() or paths.partial.exists():
            raise GenerationError(f"{req.out} exists without a manifest; choose another --out "
                                  "or --overwrite")
        opening = _opening(private_path) if private_path.exists() else None
        if opening is None and paths.replacement.exists():
            raise GenerationError(
                f"{req.out} was being replaced by a new run (--overwrite) that was stopped "
                "inside or right after its charge, before its first public file; run that "
                "command again, with --overwrite, to continue it (its seed is kept: no new "
                "charge)")
        if not private_path.exists():
            return False, None
        if opening is None:
            raise GenerationError(
                f"{private_path} is left from a run whose outputs are gone; restore "
                f"{req.out.name} and {manifest_path.name} to resume it, or delete it (or "
                "--overwrite) to start a new run (a new seed, charged anew)")
        return _continue_opening(req, private_path, opening, parameters, private_fp,
                                 fingerprint)
    old = _read_json(manifest_path)
    old_fp = _as_now(old.get("fingerprint"))
    if not isinstance(old_fp, dict):
        raise _different_run(req, " (its manifest has no fingerprint)")
    diff = _fingerprint_differences(old_fp, parameters, fingerprint)
    if diff:
        other = _other_private(private_path, private_fp)
        raise _different_run(req, f" ({_shown(diff)}"
                             + (f"; and other {other}" if other else "") + ")")
    if not private_path.exists():
        raise GenerationError(f"cannot resume {req.out}: its private side file {private_path} "
                              "(with the secret seed) is gone; choose another --out")
    other = _other_private(private_path, private_fp)
    if other:
        raise _different_run(req, f" (other {other})")
    private = _read_json(private_path)
    try:
        stored = int(private["seed"])
    except (KeyError, TypeError, ValueError):
        raise GenerationError(f"cannot resume {req.out}: {private_path} holds no seed") from None
    if req.seed is not None and req.seed != stored:
        raise GenerationError(
            f"{req.out} was started with another --seed; use the same seed or a new --out"
        )
    return True, stored
