import os
import shutil
import subprocess
import tempfile
from pathlib import Path

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
def _private_ledger(tmp_path_factory):
    """Never let a test touch the user's real privacy ledger. Its own MonkeyPatch, not the
    test's: a test that calls ``monkeypatch.undo()`` to drop its own patches would otherwise
    undo this one too, and charge ``$DPLANG_LEDGER`` or the user's default ledger."""
    patch = pytest.MonkeyPatch()
    patch.setenv("DPLANG_LEDGER", str(tmp_path_factory.mktemp("ledger") / "l.sqlite"))
    yield
    patch.undo()


#: The CPU flags each ``ATEN_CPU_CAPABILITY`` value's kernels use. PyTorch takes the variable's
#: word for it: a capability the CPU lacks runs instructions it does not have (SIGILL, seen
#: with ``avx512`` on an AMD EPYC Zen 3), so a simulated machine can only be a lesser one.
_ATEN_CAPABILITY_FLAGS = {"default": set(), "avx2": {"avx2", "fma"},
                          "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}}


@pytest.fixture(scope="session")
def skip_capability_this_cpu_lacks():
    """A function that skips the test where ``ATEN_CPU_CAPABILITY=capability`` would run
    instructions this CPU does not have (``None`` or ``default``: never)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines()
                  if line.startswith("flags")), set())

    def skip(capability):
        missing = _ATEN_CAPABILITY_FLAGS.get(capability or "default", set()) - flags
        if missing:
            pytest.skip(f"this CPU lacks {', '.join(sorted(missing))}: ATEN_CPU_CAPABILITY="
                        f"{capability} would run instructions it does not have")

    return skip


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


# --- a throw-away PostgreSQL server (the shared-ledger tests) -------------------------------

#: A role that must log in with a password (the others are trusted on the local socket).
PG_PASSWORD_ROLE = "dplang_pw"
PG_PASSWORD = "correct-horse-7"


def _postgres_bindir() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: on PATH, else Debian's newest
    /usr/lib/postgresql/*/bin."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl", path=str(Path(initdb).resolve().parent)):
        return Path(initdb).resolve().parent
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                   else 0)
    return found[-1].parent if found else None


class PostgresServer:
    """A PostgreSQL cluster in a temporary folder, listening only on a unix socket there."""

    password_role = PG_PASSWORD_ROLE
    password = PG_PASSWORD

    def __init__(self, socket_dir: Path) -> None:
        self.socket_dir = socket_dir
        self._count = 0

    def url(self, dbname: str = "postgres", user: str = "postgres",
            password: str | None = None) -> str:
        auth = user if password is None else f"{user}:{password}"
        return f"postgresql://{auth}@/{dbname}?host={self.socket_dir}"

    def admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)

    def new_database(self, name: str = "l", owner: str = "postgres") -> str:
        """A fresh, empty database (its URL, as ``postgres``)."""
        self._count += 1
        dbname = f"{name}_{self._count}".lower()
        self.admin(f'CREATE DATABASE "{dbname}" OWNER "{owner}"')
        return self.url(dbname)


@pytest.fixture(scope="session")
def postgres_server():
    """A throw-away PostgreSQL cluster for the whole session (initdb as the ``postgres`` user
    when running as root: initdb refuses root), trust authentication on a unix socket in a
    temporary folder (no TCP), except :data:`PG_PASSWORD_ROLE` which needs its password;
    stopped and deleted at the end. Skipped, with how to install them, where the server
    binaries or psycopg are missing."""
    bindir = _postgres_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in "
                    "/usr/lib/postgresql/*/bin: install Debian's server with "
                    "`apt-get install postgresql` to run the PostgreSQL ledger tests")
    pytest.importorskip("psycopg", reason="psycopg is not installed: "
                        "pip install 'dplang[postgres]'")
    as_user: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="dplang-pg-"))  # short: a socket path is <= 107 bytes
    if os.geteuid() == 0:
        import pwd

        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(base)
            pytest.skip("running as root, initdb needs an unprivileged user and no `postgres` "
                        "user exists: install Debian's `postgresql` package, which creates it")
        os.chown(base, account.pw_uid, account.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, log = base / "data", base / "server.log"
    pg_ctl = [*as_user, str(bindir / "pg_ctl"), "-D", str(data)]

    def run(cmd: list[str]) -> None:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=base)
        if done.returncode != 0:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr[-2000:]}{tail}")

    started = False
    try:
        run([*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U",
             "postgres", "-E", "UTF8", "--locale=C", "--no-sync"])
        hba = data / "pg_hba.conf"
        hba.write_text(f"local all {PG_PASSWORD_ROLE} scram-sha-256\n" + hba.read_text())
        run([*pg_ctl, "-l", str(log), "-w", "-t", "60", "-o",
             f"-c listen_addresses='' -c unix_socket_directories={base} -c fsync=off "
             "-c full_page_writes=off -c synchronous_commit=off", "start"])
        started = True
        server = PostgresServer(base)
        server.admin(f"CREATE ROLE {PG_PASSWORD_ROLE} LOGIN PASSWORD '{PG_PASSWORD}'")
        yield server
    finally:
        if started:
            subprocess.run([*pg_ctl, "-m", "immediate", "-w", "stop"], capture_output=True,
                           cwd=base, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def new_ledger(request, tmp_path):
    """A factory of fresh, empty ledger locations of one backend: ``new_ledger(name)`` is a
    file in ``tmp_path`` or a new database on the test PostgreSQL server (its URL)."""
    if request.param == "sqlite":
        return lambda name="l": tmp_path / f"{name}.sqlite"
    return request.getfixturevalue("postgres_server").new_database
