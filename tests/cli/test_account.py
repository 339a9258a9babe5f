import json

import pytest

from dplang.cli.app import main


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_account_json_vector(capsys):
    code, out, _ = run(capsys, "account", "--epsilon", "10", "--delta", "1e-6", "--tokens",
                       "500", "--batch-size", "7", "--temperature", "1.2", "--json")
    assert code == 0
    r = json.loads(out)
    assert set(r) >= {"rho", "epsilon", "delta", "clip", "margin"}
    assert r["clip"] == pytest.approx(0.659, abs=1e-3)
    assert r["rho"] == pytest.approx(1.53928, abs=1e-4)
    assert r["margin"] == pytest.approx(2 * r["clip"] / 7)


def test_account_text(capsys):
    code, out, _ = run(capsys, "account", "--epsilon", "10", "--tokens", "500", "-B", "7",
                       "--temperature", "1.2")
    assert code == 0 and "0.659" in out and "2C/B" in out


def test_clip_gives_epsilon_and_zero_out(capsys):
    _, out, _ = run(capsys, "account", "--clip", "0.6591252", "--tokens", "500", "-B", "7",
                    "--temperature", "1.2", "--json")
    r = json.loads(out)
    assert r["epsilon"] == pytest.approx(10, abs=1e-3)
    _, out, _ = run(capsys, "account", "--clip", "0.6591252", "--tokens", "500", "-B", "7",
                    "--temperature", "1.2", "--json", "--adjacency", "zero-out")
    z = json.loads(out)
    assert z["rho"] == pytest.approx(4 * r["rho"])
    _, out, _ = run(capsys, "account", "--rho", "1.53928", "--tokens", "500", "-B", "7",
                    "--temperature", "1.2", "--json")
    assert json.loads(out)["epsilon"] == pytest.approx(10, abs=1e-3)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--epsilon", "0"], "--epsilon"),
        (["--epsilon", "-1"], "--epsilon"),
        (["--epsilon", "1", "--delta", "0"], "--delta"),
        (["--epsilon", "1", "--delta", "1.5"], "--delta"),
        (["--epsilon", "1", "--tokens", "0"], "--tokens"),
        (["--epsilon", "1", "--batch-size", "0"], "--batch-size"),
        (["--epsilon", "1", "--temperature", "0"], "--temperature"),
        (["--epsilon", "1", "--clip", "0.5"], "--clip"),
        ([], "--clip"),
        (["--epsilon", "1", "--tokens", "x"], "--tokens"),
    ],
)
def test_bad_input_one_line_exit_2(capsys, args, flag):
    base = {"--tokens": "10", "--batch-size": "7"}
    argv = ["account"]
    for k, v in base.items():
        if k not in args:
            argv += [k, v]
    code, _, err = run(capsys, *argv, *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error:") and flag in err
