"""Progress meter and quiet mode of the command line."""

from __future__ import annotations

import logging
import os
import warnings

import pytest

from dplang.api.display import DPLangWarning
from dplang.cli.console import GenerationProgress, quiet_libraries


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_eta_from_the_first_tokens_on():
    """Issue 35 §3: the ETA appears with the first decoded tokens (tokens/s × tokens left, a
    group counted at T until one finishes), not after the first wave of groups."""
    clock = Clock()
    meter = GenerationProgress(pending=10, clock=clock, max_tokens=5)
    assert meter.eta_seconds() is None and meter.eta_text() == "ETA after the first tokens"
    clock.now += 2.0
    meter.step(4)  # four groups decoded together, one token each: 2 tok/s
    assert meter.rate_text() == "2.0 tok/s"
    # 10 groups × T = 5 tokens expected, 4 decoded, at 2 tok/s: 23 s left
    assert meter.eta_seconds() == pytest.approx(23.0) and meter.eta_text() == "ETA 0:00:23"
    for _ in range(4):
        clock.now += 2.0
        meter.step(4)
    meter.group_done(5)  # the first group ended after 5 tokens: 20 tokens in 10 s
    # from now on the finished groups' mean length: 10 × 5 expected, 20 decoded: 15 s left
    assert meter.eta_seconds() == pytest.approx(15.0)
    assert meter.eta_text() == "ETA 0:00:15"
    for _ in range(9):
        meter.group_done(5)
    assert meter.eta_seconds() == 0.0
    # without a known T, the ETA waits for the first finished group
    assert GenerationProgress(pending=2, clock=clock).eta_seconds() is None


def test_the_python_bar_shows_one_eta(capsys):
    """The Python API's tqdm bar shows the meter's ETA only (tqdm's own remaining time, from
    finished texts, disagreed with it)."""
    from dplang.api.display import TqdmDisplay

    display = TqdmDisplay()
    display.start(8, 0, max_tokens=4)
    display.step(8)
    display.finish()
    err = capsys.readouterr().err
    assert err.count("ETA") >= 1 and "<" not in err and "s/text" not in err, err


def test_quiet_libraries_silences_and_restores():
    os.environ.pop("TQDM_DISABLE", None)
    logger = logging.getLogger("transformers")
    level = logger.level
    with quiet_libraries(True):
        assert os.environ["TQDM_DISABLE"] == "1"
        assert logging.getLogger("transformers").level == logging.ERROR
        with warnings.catch_warnings(record=True) as caught:
            warnings.warn("a library's advice", UserWarning, stacklevel=1)
            warnings.warn("dplang's own", DPLangWarning, stacklevel=1)
        assert [str(w.message) for w in caught] == ["dplang's own"]
    assert "TQDM_DISABLE" not in os.environ and logger.level == level
    with quiet_libraries(False):
        assert "TQDM_DISABLE" not in os.environ


def test_quiet_drops_what_c_libraries_write_to_stderr(capfd):
    """``evaluate -q`` drops faiss's clustering advice, which C++ writes to the stderr
    descriptor; dplang's own lines (Python's sys.stderr) still go out."""
    import sys

    with quiet_libraries(True):
        os.write(2, b"WARNING clustering 10 points to 5 centroids\n")
        print("error: kept", file=sys.stderr)
    os.write(2, b"after\n")
    err = capfd.readouterr().err
    assert "clustering" not in err and "error: kept" in err and "after" in err


def test_population_methods_have_no_eta():
    """Aug-PE's bar shows no "ETA after the first group" (its texts all come at the end)."""
    clock = Clock()
    meter = GenerationProgress(pending=2, clock=clock, population=True)
    clock.now += 5.0
    meter.step(0)
    assert meter.eta_seconds() is None and meter.eta_text() == "all texts come at the end"
    meter.group_done(3)
    meter.group_done(4)
    assert meter.eta_text() == ""
