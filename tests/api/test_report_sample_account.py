"""``dplang.report``, ``dplang.sample`` and ``dplang.account``: the commands as one
call each, with the command line's privacy rules, messages and files."""

from __future__ import annotations

import json

import pytest

import dplang
from dplang.cli.app import main
from dplang.privacy.ledger import PrivacyLedger

REVIEWS = ([f"the soup was great, review {i}" for i in range(30)]
           + [f"slow service, review {i}" for i in range(10)])


def _releases(dataset: str) -> list[dict]:
    ledger = PrivacyLedger()
    return ledger.releases(dataset) if dataset in ledger.datasets() else []


def test_account_returns_what_account_json_prints(capsys):
    result = dplang.account(epsilon=3, tokens=100, batch_size=5)
    assert main(["account", "--epsilon", "3", "-T", "100", "-B", "5", "--json"]) == 0
    assert result == json.loads(capsys.readouterr().out)
    assert result["clip"] > 0 and result["rho"] == pytest.approx(
        dplang.account(rho=result["rho"], tokens=100, batch_size=5)["rho"])
    with pytest.raises(dplang.DPLangError, match="exactly one of epsilon, rho or clip"):
        dplang.account(epsilon=1, rho=1)
    with pytest.raises(dplang.DPLangError, match="ε ≤ 100"):
        dplang.account(clip=1e300)


def test_report_from_a_list_in_one_call(tmp_path):
    result = dplang.report(REVIEWS, epsilon=2, threshold=0.3, dataset="reviews", seed=1,
                           statements=[("Reviewers praise the soup", "great"),
                                       "Service is slow\tslow"], quiet=True)
    assert {c.statement for c in result.emitted} == {"Reviewers praise the soup"}
    assert [c.statement for c in result.abstained] == ["Service is slow"]
    assert result.guarantee.epsilon == pytest.approx(2) and result.out is None
    assert result.document["guarantee"]["epsilon"] == pytest.approx(2)
    assert "Reviewers praise the soup" in result.markdown
    # the statements' file is named, not its (temporary) folder
    assert result.document["statements"]["path"] == "statements.txt"
    assert "dplang-statements" not in json.dumps(result.document) + result.markdown
    assert list(result.to_pandas()["decision"]) == ["emit", "abstain"]
    assert len(_releases("reviews")) == 1
    # out= writes the command line's files; an existing folder is refused before the charge
    with pytest.raises(dplang.DPLangError, match="is an existing folder"):
        dplang.report(REVIEWS, epsilon=2, threshold=0.3, dataset="reviews", out=tmp_path,
                      statements=["Service is slow\tslow"], quiet=True)
    kept = dplang.report(REVIEWS, epsilon=2, threshold=0.3, dataset="reviews",
                         out=tmp_path / "r", statements=["Service is slow\tslow"],
                         quiet=True)
    assert kept.out == tmp_path / "r"
    assert json.loads((tmp_path / "r.json").read_text()) == kept.document
    assert (tmp_path / "r.md").read_text() == kept.markdown
    assert len(_releases("reviews")) == 2


def test_report_over_budget_is_refused_before_reading(tmp_path):
    data = tmp_path / "reviews.txt"
    data.write_text("\n".join(REVIEWS) + "\n")
    PrivacyLedger().set_budget(str(data.resolve()), 1.0, 1e-6)
    with pytest.raises(dplang.DPLangError, match="over its budget") as info:
        dplang.report(data, epsilon=2, threshold=0.3, statements=["Slow\tslow"], quiet=True)
    assert info.value.code == 3 and not _releases(str(data.resolve()))


def test_sample_from_records_and_a_dataframe(tmp_path):
    pd = pytest.importorskip("pandas")
    records = [{"stars": i % 5 + 1, "city": "ab"[i % 2]} for i in range(200)]
    result = dplang.sample(records, columns=["stars", "city"], epsilon=1, num=2,
                           domain={"stars": range(1, 6), "city": ["a", "b"]}, dataset="shop",
                           seed=3, quiet=True)
    assert len(result) == 2 and result.columns == ["stars", "city"]
    assert all(s["stars"] in range(1, 6) and s["city"] in ("a", "b") for s in result.samples)
    assert result.manifest["guarantee"] == result.guarantee.to_dict()
    assert list(result.to_pandas().columns) == ["stars", "city"]
    [release] = _releases("shop")
    assert release["guarantee"]["epsilon"] == pytest.approx(1)
    # the same rows as a DataFrame and the same seed: the same samples (and the same release)
    frame = pd.DataFrame(records)
    again = dplang.sample(frame, columns="stars,city", epsilon=1, num=2, dataset="shop",
                          domain={"stars": "1..5", "city": ["a", "b"]}, seed=3, quiet=True)
    assert again.samples == result.samples and len(_releases("shop")) == 1
    out = tmp_path / "s.jsonl"
    kept = dplang.sample(frame, columns="stars", epsilon=1, domain={"stars": "1..5"},
                         dataset="shop", out=out, quiet=True)
    assert [json.loads(x) for x in out.read_text().splitlines()] == kept.samples
    with pytest.raises(dplang.DPLangError, match="dataset= is required"):
        dplang.sample(records, columns="stars", epsilon=1, domain={"stars": "1..5"})
    with pytest.raises(dplang.DPLangError, match=r"'binary', 'lo\.\.hi' or a list"):
        dplang.sample(records, columns="stars", epsilon=1, domain={"stars": 5}, dataset="x")
