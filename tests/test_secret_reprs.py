"""Objects that hold a secret seed or a ledger location (a PostgreSQL URL may carry a password)
do not show them in their repr, so a log line or a traceback that prints one leaks neither."""

from dplang.reports.pipeline import ReportRequest
from dplang.sampling.release import ReleaseRequest
from dplang.textgen.orchestration import GenerationRequest

SEED, URL = 918273645, "postgresql://alice:hunter2-secret@/ledger"


def test_generation_request_repr_hides_seed_and_ledger():
    req = GenerationRequest(data="x.csv", out="o.jsonl", batch_size=3, max_tokens=4,
                            temperature=1.0, top_k=5, seed=SEED, ledger=URL)
    assert str(SEED) not in repr(req) and "hunter2" not in repr(req)
    assert req.seed == SEED and req.ledger == URL


def test_report_and_sample_requests_hide_seed_and_ledger():
    for cls in (ReportRequest, ReleaseRequest):
        fields = cls.__dataclass_fields__
        assert not fields["seed"].repr and not fields["ledger"].repr, cls.__name__


def test_release_repr_hides_seed_digest_and_ledger():
    from dplang.release import Release

    fields = Release.__dataclass_fields__
    assert not any(fields[name].repr for name in ("seed", "data_digest", "ledger_path"))
