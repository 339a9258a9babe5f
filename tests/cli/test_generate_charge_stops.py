"""A run stopped inside its charge, or between the charge and its first public files, keeps
its seed: the side file is written before the charge (its ``stage`` "opened"), and the same
command continues the release, charged once (``dplang.textgen.resume``)."""

import json

import pytest

from dplang.privacy.ledger import PrivacyLedger
from dplang.release import OPENED_STAGE, Release

from .test_generate import PRIVATE, custom_template, run, toy, write_csv  # noqa: F401

pytestmark = pytest.mark.usefixtures("toy")  # the toy model for every run


def _args(tmp_path, data, *extra):
    """A run without --seed (fresh OS entropy): only its side file can give the seed back."""
    return ["--data", str(data), "--out", str(tmp_path / "a.jsonl"), "--epsilon", "5",
            "--batch-size", "3", "--max-tokens", "4", "--top-k", "4", "--prompt",
            str(custom_template(tmp_path)), "--quiet", *extra]


def _side(tmp_path):
    return json.loads((tmp_path / PRIVATE / "a.private.json").read_text())


def _releases(data):
    return PrivacyLedger().spent(str(data.resolve())).releases


def _stop_in_charge(monkeypatch, *, record: bool):
    """Ctrl-C inside the ledger's charge, after it recorded the release or before."""
    original = PrivacyLedger.charge

    def charge(self, *args, **kw):
        if record:
            original(self, *args, **kw)
        monkeypatch.setattr(PrivacyLedger, "charge", original)  # the next run charges
        raise KeyboardInterrupt

    monkeypatch.setattr(PrivacyLedger, "charge", charge)


def test_a_stop_after_the_ledger_recorded_the_charge_is_continued_once(tmp_path, capsys,
                                                                        monkeypatch):
    data = write_csv(tmp_path / "d.csv", 6)
    _stop_in_charge(monkeypatch, record=True)
    code, _, err = run(capsys, *_args(tmp_path, data))
    assert code == 130 and "it is in the ledger" in err and "to continue it" in err, err
    assert "charged again" not in err
    opening = _side(tmp_path)
    assert opening["stage"] == OPENED_STAGE and isinstance(opening["seed"], int)
    assert not (tmp_path / "a.jsonl").exists() and not (tmp_path / "a.manifest.json").exists()
    assert _releases(data) == 1
    # another run in the same --out is refused: the charged seed would be lost
    code, _, err = run(capsys, *_args(tmp_path, data, "--max-tokens", "3"))
    assert code == 2 and "charged but stopped before its first public file" in err, err
    assert "max_tokens" in err and err.count("\n") == 1
    # the same command continues it: same seed, no new charge
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    side = _side(tmp_path)
    assert side["seed"] == opening["seed"] and side["release_id"] == opening["release_id"]
    assert "stage" not in side and side["data"]["read"]["used"] == 6
    assert _releases(data) == 1
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 2


def test_a_stop_before_the_ledger_recorded_it_leaves_nothing_that_binds(tmp_path, capsys,
                                                                        monkeypatch):
    data = write_csv(tmp_path / "d.csv", 6)
    _stop_in_charge(monkeypatch, record=False)
    code, _, err = run(capsys, *_args(tmp_path, data))
    assert code == 130 and "nothing was charged" in err, err
    opening = _side(tmp_path)
    assert _releases(data) == 0
    # a different run replaces the uncharged opening (nothing was charged or published)
    assert run(capsys, *_args(tmp_path, data, "--max-tokens", "3"))[0] == 0
    side = _side(tmp_path)
    assert side["release_id"] != opening["release_id"] and _releases(data) == 1


def test_the_same_command_after_an_uncharged_stop_uses_the_kept_seed(tmp_path, capsys,
                                                                     monkeypatch):
    data = write_csv(tmp_path / "d.csv", 6)
    _stop_in_charge(monkeypatch, record=False)
    assert run(capsys, *_args(tmp_path, data))[0] == 130
    opening = _side(tmp_path)
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    assert _side(tmp_path)["seed"] == opening["seed"] and _releases(data) == 1


def test_a_stop_between_the_manifest_and_the_side_file_is_resumed(tmp_path, capsys,
                                                                  monkeypatch):
    data = write_csv(tmp_path / "d.csv", 6)
    original = Release.write_private

    def stop(self, paths, record):
        monkeypatch.setattr(Release, "write_private", original)
        raise KeyboardInterrupt

    monkeypatch.setattr(Release, "write_private", stop)
    assert run(capsys, *_args(tmp_path, data))[0] == 130
    assert _side(tmp_path)["stage"] == OPENED_STAGE
    # the manifest written before the stop does not say "running" after it
    assert json.loads((tmp_path / "a.manifest.json").read_text())["status"] == "interrupted"
    seed = _side(tmp_path)["seed"]
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    side = _side(tmp_path)
    assert side["seed"] == seed and "stage" not in side and "read" in side["data"]
    assert _releases(data) == 1


def test_a_refused_charge_leaves_no_side_file_nor_folder(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", 6)
    PrivacyLedger().set_budget(str(data.resolve()), epsilon=1.0, delta=1e-6)
    code, _, err = run(capsys, *_args(tmp_path, data))
    assert code == 3 and "budget" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "t.toml"]


def test_an_overwrite_keeps_the_earlier_run_until_the_new_one_is_charged(tmp_path, capsys,
                                                                         monkeypatch):
    data = write_csv(tmp_path / "d.csv", 6)
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    before = {p: p.read_bytes() for p in (tmp_path / "a.jsonl", tmp_path / "a.manifest.json",
                                          tmp_path / PRIVATE / "a.private.json")}
    _stop_in_charge(monkeypatch, record=False)
    assert run(capsys, *_args(tmp_path, data, "--overwrite"))[0] == 130
    assert {p: p.read_bytes() for p in before} == before
    assert run(capsys, *_args(tmp_path, data, "--overwrite"))[0] == 0
    assert _side(tmp_path)["seed"] != json.loads(before[tmp_path / PRIVATE / "a.private.json"]
                                                 )["seed"]
    assert _releases(data) == 2


def test_a_stop_right_after_the_publish_says_complete(tmp_path, capsys, monkeypatch):
    data = write_csv(tmp_path / "d.csv", 6)
    original = Release.publish

    def publish_then_stop(self, paths, text):
        original(self, paths, text)
        raise KeyboardInterrupt

    monkeypatch.setattr(Release, "publish", publish_then_stop)
    assert run(capsys, *_args(tmp_path, data))[0] == 130
    manifest = json.loads((tmp_path / "a.manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["generations_written"] == 2
    monkeypatch.setattr(Release, "publish", original)
    published = (tmp_path / "a.jsonl").read_bytes()
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    assert (tmp_path / "a.jsonl").read_bytes() == published and _releases(data) == 1


def test_an_opening_charged_to_another_ledger_is_never_replaced(tmp_path, capsys, monkeypatch):
    """Only the ledger an opening was charged to can say it was not: another ledger (another
    $DPLANG_LEDGER, a mistyped --ledger) does not hold it, and must not let its seed go."""
    data = write_csv(tmp_path / "d.csv", 6)
    _stop_in_charge(monkeypatch, record=True)
    assert run(capsys, *_args(tmp_path, data))[0] == 130
    opening = _side(tmp_path)
    other = tmp_path / "other-ledger.sqlite"
    code, _, err = run(capsys, *_args(tmp_path, data, "--max-tokens", "3", "--ledger",
                                      str(other)))
    assert code == 2 and "other-ledger.sqlite" in err and "--overwrite" in err, err
    assert _side(tmp_path) == opening


def test_an_overwrite_stopped_before_its_manifest_keeps_its_seed(tmp_path, capsys, monkeypatch):
    data = write_csv(tmp_path / "d.csv", 6)
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    first = _side(tmp_path)["seed"]
    original = Release.write_manifest

    def stop(self, paths, manifest):
        monkeypatch.setattr(Release, "write_manifest", original)
        raise KeyboardInterrupt

    monkeypatch.setattr(Release, "write_manifest", stop)
    code, _, err = run(capsys, *_args(tmp_path, data, "--overwrite"))
    assert code == 130 and "no text was written yet" in err, err
    assert "run the same command again to continue it (no new charge)" in err
    opening = _side(tmp_path)
    assert opening["stage"] == OPENED_STAGE and opening["seed"] != first
    assert _releases(data) == 2
    # as the message says: the same command (--overwrite and all) continues it, no new charge
    assert run(capsys, *_args(tmp_path, data, "--overwrite"))[0] == 0
    assert _side(tmp_path)["seed"] == opening["seed"] and _releases(data) == 2


@pytest.mark.parametrize("plain_rerun", [False, True])
def test_an_overwrite_stopped_right_after_its_charge_is_continued_once(
        tmp_path, capsys, monkeypatch, plain_rerun):
    """An --overwrite's new seed was written only after the earlier run's files went, after
    the charge: a stop inside the charge (a Ctrl-C seen when COMMIT returns) lost it, and the
    same command charged the same texts' release a second time. The seed is kept beside the
    earlier files, before the charge."""
    data = write_csv(tmp_path / "d.csv", 6)
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    before = {p: p.read_bytes() for p in (tmp_path / "a.jsonl", tmp_path / "a.manifest.json",
                                          tmp_path / PRIVATE / "a.private.json")}
    _stop_in_charge(monkeypatch, record=True)
    code, _, err = run(capsys, *_args(tmp_path, data, "--overwrite", "--max-tokens", "3"))
    assert code == 130 and "a.jsonl.replacing.json" in err and "to continue it" in err, err
    assert {p: p.read_bytes() for p in before} == before  # the earlier run is untouched
    kept = json.loads((tmp_path / PRIVATE / "a.jsonl.replacing.json").read_text())
    assert _releases(data) == 2
    if plain_rerun:  # without --overwrite: the earlier run's manifest is another run's
        code, _, err = run(capsys, *_args(tmp_path, data, "--max-tokens", "3"))
        assert code == 2 and "--overwrite" in err, err
    assert run(capsys, *_args(tmp_path, data, "--overwrite", "--max-tokens", "3"))[0] == 0
    side = _side(tmp_path)
    assert side["seed"] == kept["seed"] and side["release_id"] == kept["release_id"]
    assert _releases(data) == 2 and not (tmp_path / PRIVATE / "a.jsonl.replacing.json").exists()


def test_an_overwrite_stopped_while_it_replaces_the_earlier_files(tmp_path, capsys,
                                                                  monkeypatch):
    """Stopped after the earlier run's public files went, before its seed took the side
    file's place: the plain command says how to continue; the same command does, charged
    once."""
    from dplang.release import OutputPaths

    data = write_csv(tmp_path / "d.csv", 6)
    assert run(capsys, *_args(tmp_path, data))[0] == 0

    def half(self):
        self.remove(keep_private=True)
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:  # (undo() would drop the toy model too)
        patch.setattr(OutputPaths, "take_replacement", half)
        assert run(capsys, *_args(tmp_path, data, "--overwrite", "--max-tokens", "3"))[0] == 130
    assert not (tmp_path / "a.jsonl").exists() and _releases(data) == 2
    code, _, err = run(capsys, *_args(tmp_path, data, "--max-tokens", "3"))
    assert code == 2 and "was being replaced" in err and "with --overwrite" in err, err
    assert run(capsys, *_args(tmp_path, data, "--overwrite", "--max-tokens", "3"))[0] == 0
    assert _releases(data) == 2 and _side(tmp_path)["data"]["read"]["used"] == 6


def test_an_overwrite_refused_by_the_budget_leaves_the_earlier_run_alone(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", 6)
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    PrivacyLedger().set_budget(str(data.resolve()), epsilon=6.0, delta=1e-6)
    before = sorted(p.name for p in (tmp_path / PRIVATE).iterdir())
    code, _, err = run(capsys, *_args(tmp_path, data, "--overwrite"))
    assert code == 3 and "budget" in err, err
    assert sorted(p.name for p in (tmp_path / PRIVATE).iterdir()) == before


def test_an_output_path_that_looks_like_markup(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", 6)
    out = tmp_path / "x[" / "b]" / "a.jsonl"
    args = _args(tmp_path, data)
    args[args.index("--out") + 1] = str(out)
    args.remove("--quiet")
    code, _, err = run(capsys, *args)
    assert code == 0, err
    assert out.exists() and str(out) in capsys.readouterr().err + err


def test_an_overwrite_stopped_after_its_side_file_before_any_text(tmp_path, capsys,
                                                                  monkeypatch):
    """Manifest and side file written, no text yet: the message says the same command
    continues it, and the same command (--overwrite included) does, charged once."""
    data = write_csv(tmp_path / "d.csv", 6)
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    original = Release.write_private

    def stop(self, *args, **kw):
        original(self, *args, **kw)
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(Release, "write_private", stop)
        code, _, err = run(capsys, *_args(tmp_path, data, "--overwrite", "--max-tokens", "3"))
    assert code == 130 and "no text was written yet" in err and "to continue it" in err, err
    kept = _side(tmp_path)["seed"]
    assert run(capsys, *_args(tmp_path, data, "--overwrite", "--max-tokens", "3"))[0] == 0
    assert _side(tmp_path)["seed"] == kept and _releases(data) == 2


def test_a_replacement_with_nothing_left_to_replace_is_removed(tmp_path, capsys, monkeypatch):
    """A kept replacement whose earlier files were deleted by hand is continued once, then
    goes: kept, every later --overwrite of its command would reuse its seed (no fresh
    texts)."""
    data = write_csv(tmp_path / "d.csv", 6)
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    _stop_in_charge(monkeypatch, record=True)
    assert run(capsys, *_args(tmp_path, data, "--overwrite"))[0] == 130
    for name in ("a.jsonl", "a.manifest.json", PRIVATE + "/a.private.json"):
        (tmp_path / name).unlink()
    assert run(capsys, *_args(tmp_path, data, "--overwrite"))[0] == 0
    assert not (tmp_path / PRIVATE / "a.jsonl.replacing.json").exists()
    first = _side(tmp_path)["seed"]
    assert run(capsys, *_args(tmp_path, data, "--overwrite"))[0] == 0
    assert _side(tmp_path)["seed"] != first and _releases(data) == 3


def _half_replace(monkeypatch):
    from dplang.release import OutputPaths

    def half(self):
        self.adopt_legacy_private()
        self.remove(keep_private=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(OutputPaths, "take_replacement", half)


def test_an_overwrite_continued_after_an_upgrade_keeps_its_release(tmp_path, capsys,
                                                                   monkeypatch):
    """A newer version's fingerprint (a key added, None here) still matches the kept run:
    the continuation keeps the kept fingerprint, so its release id is the charged one (with
    today's, the ledger refused the seed as reused, the kept seed was dropped, and the next
    --overwrite charged again)."""
    import dplang.textgen.orchestration as orchestration

    data = write_csv(tmp_path / "d.csv", 6)
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    original = orchestration._fingerprint
    with monkeypatch.context() as patch:
        patch.setattr(orchestration, "_fingerprint",
                      lambda plan: {k: v for k, v in original(plan).items() if k != "numerics"})
        _half_replace(patch)
        assert run(capsys, *_args(tmp_path, data, "--overwrite", "-T", "3"))[0] == 130
    assert _releases(data) == 2
    code, _, err = run(capsys, *_args(tmp_path, data, "--overwrite", "-T", "3"))
    assert code == 0, err
    assert _releases(data) == 2


def test_an_overwrite_after_the_texts_of_a_complete_run_were_deleted_is_a_new_run(
        tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", 6)
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    first = _side(tmp_path)["seed"]
    (tmp_path / "a.jsonl").unlink()
    assert run(capsys, *_args(tmp_path, data, "--overwrite"))[0] == 0
    assert _side(tmp_path)["seed"] != first and _releases(data) == 2


def test_an_overwrite_of_a_run_with_a_legacy_side_file_stopped_half_way(tmp_path, capsys,
                                                                        monkeypatch):
    """An older dplang's side file name: half-way through the replacement it is kept (under
    the current name), so the earlier command is refused and the same command continues."""
    data = write_csv(tmp_path / "d.csv", 6)
    assert run(capsys, *_args(tmp_path, data))[0] == 0
    (tmp_path / PRIVATE / "a.private.json").rename(tmp_path / PRIVATE / "a.jsonl.private.json")
    from dplang.release import OutputPaths

    original = OutputPaths.remove

    def remove_then_stop(self, *, keep_private=False):
        original(self, keep_private=keep_private)
        if keep_private:  # inside take_replacement, before its rename
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(OutputPaths, "remove", remove_then_stop)
        assert run(capsys, *_args(tmp_path, data, "--overwrite", "-T", "3"))[0] == 130
    assert _releases(data) == 2
    code, _, err = run(capsys, *_args(tmp_path, data))
    assert code == 2 and "was being replaced" in err, err
    assert run(capsys, *_args(tmp_path, data, "--overwrite", "-T", "3"))[0] == 0
    assert _releases(data) == 2


def test_two_kept_runs_with_one_given_seed_are_told_apart(tmp_path, capsys, monkeypatch):
    """Run A (ε = 8) and run B (ε = 1) with one given --seed both left a kept opening (A's
    uncharged in the side file, B's charged as a replacement). A's command with --overwrite
    is A's own release, which the ledger refuses (its seed is B's): the kept run was found by
    its seed alone, and A's ε = 8 texts went out under B's fingerprint and B's ε = 1 charge."""
    data = write_csv(tmp_path / "d.csv", 6)

    def args(epsilon, *extra):
        return [*_args(tmp_path, data, "--seed", "5", *extra)[:5], epsilon,
                *_args(tmp_path, data, "--seed", "5", *extra)[6:]]

    _stop_in_charge(monkeypatch, record=False)
    assert run(capsys, *args("8"))[0] == 130
    _stop_in_charge(monkeypatch, record=True)
    assert run(capsys, *args("1", "--overwrite"))[0] == 130
    assert _releases(data) == 1
    code, _, err = run(capsys, *args("8", "--overwrite"))
    assert code == 3 and "seed was already used" in err, err
    assert not (tmp_path / "a.manifest.json").exists() and _releases(data) == 1
    # B's command continues B, charged once
    assert run(capsys, *args("1", "--overwrite"))[0] == 0
    manifest = json.loads((tmp_path / "a.manifest.json").read_text())
    assert manifest["fingerprint"]["parameters"]["epsilon"] == manifest["epsilon"] == 1
    assert _releases(data) == 1
