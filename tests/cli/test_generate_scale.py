"""``dplang generate --executor/--workers/--device``: one-line refusals before
anything is read or charged; ``local`` workers give the inline run's bytes; a driver killed
mid-run and restarted resumes to the same bytes, and its workers do not outlive it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import dplang.cli.generate as gen_cli
import dplang.models.devices as devices
from dplang.cli.app import main
from dplang.models import ToyModel
from dplang.privacy.ledger import PrivacyLedger

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def toy(monkeypatch):
    model = ToyModel(vocab_size=30, eos_after=3)
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32", **_: model)
    return model


def setup(tmp_path, n=30):
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "".join(f"review number {i} was {'fine ' * (i % 4)}\n"
                                       for i in range(n)))
    template = tmp_path / "t.toml"
    template.write_text('private = "Here: {reference}\\nAnother:"\npublic = "Another:"\n')
    return data, template


def args(data, template, out, *extra):
    return ["generate", "--data", str(data), "--out", str(out), "--epsilon", "10",
            "--batch-size", "3", "--max-tokens", "6", "--top-k", "4", "--seed", "5",
            "--prompt", str(template), "-G", "2", "--quiet", *extra]


def run(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize(("extra", "needle"), [
    (["--device", "cuda"], "--device cuda: no CUDA GPU is available here"),
    (["--device", "tpu"], "--device must be one of"),
    (["--executor", "threads"], "--executor must be one of"),
    (["--executor", "local", "--workers", "0"], "--workers must be >= 1"),
    (["--executor", "local", "--method", "augpe"], "does not run --method augpe"),
    (["--executor", "local", "--worker-timeout", "0"], "--worker-timeout must be a finite"),
    (["--executor", "ray", "--worker-timeout", "nan"], "--worker-timeout must be a finite"),
])
def test_refused_in_one_line_before_anything_is_read(tmp_path, capsys, monkeypatch, extra,
                                                     needle):
    monkeypatch.setattr(devices, "cuda_available", lambda: False)

    def never(*_a, **_k):
        raise AssertionError("the data was read")

    monkeypatch.setattr(gen_cli, "_load_model", never)
    monkeypatch.setattr("dplang.textgen.orchestration.load_references", never)
    data, template = setup(tmp_path)
    out = tmp_path / "x.jsonl"
    code, err = run(capsys, args(data, template, out, *extra))
    assert code == 2 and needle in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "t.toml"]
    assert PrivacyLedger().spent(str(data.resolve())).releases == 0


def test_device_auto_without_a_gpu_runs_on_the_cpu(tmp_path, capsys, monkeypatch, toy):
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    data, template = setup(tmp_path)
    code, err = run(capsys, args(data, template, tmp_path / "a.jsonl", "--device", "auto"))
    assert code == 0, err


def test_local_workers_write_the_inline_runs_bytes(tmp_path, capsys, toy):
    data, template = setup(tmp_path)
    assert run(capsys, args(data, template, tmp_path / "inline.jsonl"))[0] == 0
    code, err = run(capsys, args(data, template, tmp_path / "local.jsonl",
                                 "--executor", "local", "--workers", "2"))
    assert code == 0, err
    assert (tmp_path / "local.jsonl").read_bytes() == (tmp_path / "inline.jsonl").read_bytes()
    # the worker count is not part of the run's identity: the manifests' fingerprints agree
    fp = [json.loads((tmp_path / f"{n}.manifest.json").read_text())["fingerprint"]
          for n in ("inline", "local")]
    assert fp[0] == fp[1]
    assert PrivacyLedger().spent(str(data.resolve())).releases == 1  # the same release


def test_local_driver_loads_only_the_tokenizer_and_writes_the_inline_release(
        tmp_path, capsys, monkeypatch, tiny_llama_dir):
    """--model PATH with --executor local: the driver never builds the model (the workers
    do); the output, the public manifest and the release are the inline run's."""
    data, template = setup(tmp_path, n=12)
    model = ["--model", str(tiny_llama_dir)]
    assert run(capsys, args(data, template, tmp_path / "inline.jsonl", *model))[0] == 0

    def no_weights_here(*_a, **_k):
        raise AssertionError("the driver loaded the whole model")

    monkeypatch.setattr(gen_cli, "resolve_model", no_weights_here)
    code, err = run(capsys, args(data, template, tmp_path / "local.jsonl", *model,
                                 "--executor", "local", "--workers", "1"))
    assert code == 0, err
    assert (tmp_path / "local.jsonl").read_bytes() == (tmp_path / "inline.jsonl").read_bytes()
    manifests = [json.loads((tmp_path / f"{n}.manifest.json").read_text())
                 for n in ("inline", "local")]
    for found in manifests:
        found.pop("started")  # when each run began
    assert manifests[0] == manifests[1]
    assert PrivacyLedger().spent(str(data.resolve())).releases == 1  # the same release


DRIVER = textwrap.dedent("""
    import json, sys
    import dplang.api.generation as api_gen
    import dplang.cli.generate as gen_cli
    import dplang.textgen.executors as ex
    from dplang.cli.app import main
    from dplang.models import ToyModel

    model = ToyModel(vocab_size=30, eos_after=3, step_delay=float(sys.argv[1]))
    gen_cli._load_model = lambda spec, dtype="float32", **_: model
    pids = open(sys.argv[2], "a")

    def events(name, fields):
        if name == "worker_ready":
            pids.write(f"{fields['pid']}\\n")
            pids.flush()

    def make(name, workers=1, **kw):
        return ex.make_executor(name, workers, **{**kw, "events": events})

    if __name__ == "__main__":  # spawned workers import this file again as __mp_main__
        api_gen.make_executor = make
        sys.exit(main(sys.argv[3:]))
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_driver_killed_mid_run_resumes_to_the_same_bytes(tmp_path, capsys, toy):
    data, template = setup(tmp_path, n=45)
    assert run(capsys, args(data, template, tmp_path / "inline.jsonl"))[0] == 0
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    pid_file = tmp_path / "pids.txt"
    out = tmp_path / "local.jsonl"
    argv = args(data, template, out, "--executor", "local", "--workers", "2")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    driver = subprocess.Popen([sys.executable, str(script), "0.05", str(pid_file), *argv],
                              env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    partial = tmp_path / ".dplang-private" / "local.jsonl.partial"  # private while running
    while time.monotonic() < deadline and driver.poll() is None:
        if partial.exists() and partial.read_text().count("\n") >= 2:
            break
        time.sleep(0.05)
    assert driver.poll() is None, driver.stderr.read().decode()[-2000:]
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert not out.exists()
    part = partial.read_bytes()
    total = (tmp_path / "inline.jsonl").read_bytes()
    assert 0 < len(part) < len(total) and total.startswith(part)  # a prefix, in group order
    workers = [int(p) for p in pid_file.read_text().split()]
    assert workers
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers), "a worker outlived its driver"
    manifest = json.loads((tmp_path / "local.manifest.json").read_text())
    assert manifest["status"] == "running"  # killed: it never got to say otherwise
    restart = subprocess.run([sys.executable, str(script), "0", str(pid_file), *argv],
                             env=env, capture_output=True, timeout=300)
    assert restart.returncode == 0, restart.stderr.decode()[-2000:]
    assert out.read_bytes() == total
    assert PrivacyLedger().spent(str(data.resolve())).releases == 1
