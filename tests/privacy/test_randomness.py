import numpy as np
import pytest

from dplang.privacy import RandomStreams


def test_stream_is_function_of_seed_and_index():
    a = RandomStreams(7).generator(3).random(5)
    b = RandomStreams(7).generator(3).random(5)
    assert np.array_equal(a, b)
    # independent of the order in which units are created
    s = RandomStreams(7)
    _ = [s.generator(i).random() for i in range(10)]
    assert np.array_equal(s.generator(3).random(5), a)
    assert not np.array_equal(RandomStreams(7).generator(4).random(5), a)
    assert not np.array_equal(RandomStreams(8).generator(3).random(5), a)


def test_matches_seedsequence_spawn():
    children = np.random.SeedSequence(11).spawn(5)
    for i, child in enumerate(children):
        ours = RandomStreams(11).generator(i).integers(0, 2**31, size=4)
        theirs = np.random.Generator(np.random.PCG64(child)).integers(0, 2**31, size=4)
        assert np.array_equal(ours, theirs)


def test_os_entropy_mode():
    a = RandomStreams.from_os_entropy().generator(0).random(4)
    b = RandomStreams.from_os_entropy().generator(0).random(4)
    assert not np.array_equal(a, b)
    with pytest.raises(ValueError):
        RandomStreams(None)
    with pytest.raises(ValueError):
        RandomStreams(-1)
