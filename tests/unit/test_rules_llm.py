"""The LLM proposer over real HTTP against a local OpenAI-compatible server serving recorded responses."""

import shutil

import pytest

from sigma.paths import configs_dir
from sigma.rules.learn import LearnError
from sigma.rules.learn.config import LearnConfig, LlmConfig
from sigma.rules.learn.run import Breaker, run
from sigma.rules.learn.store import Candidates
from sigma.rules.loader import load_rules
from tests.conftest import FIXTURES
from tests.unit.llm_server import LocalLLM
from tests.unit.rules_learn_helpers import T0, FakeHistory

RECORDINGS = FIXTURES / "rules"


@pytest.fixture
def history(tmp_path):
    shutil.copytree(configs_dir() / "rules", tmp_path / "rules")
    h = FakeHistory(tmp_path / "c.db", hours=2)
    for node, dt in (("node2", 1800), ("node3", 4000), ("node1", 6000)):
        h.nvme_fault(node, T0 + dt)
    return h, tmp_path / "rules"


def learn(h, kb, llm: LocalLLM, only="llm", timeout_s=10.0, proposers=("deterministic", "llm")):
    cfg = LearnConfig(proposers=list(proposers), llm=LlmConfig(base_url=llm.base_url, model="recorded-model",
                                                               timeout_s=timeout_s))
    return run(h.conn, cfg, load_rules(kb), Candidates(kb), since=T0, breaker=Breaker(), total_nodes=4, now=h.end,
               only=only)


def test_llm_proposals_go_through_repair_and_review_and_get_the_review_back(history):
    h, kb = history
    with LocalLLM(RECORDINGS / "llm-recording-nvme.json") as llm:
        result = learn(h, kb, llm)
    # round 1: a too-broad regex (rejected by review: it matches healthy USB resets) and a catastrophic one
    # (rejected by repair); round 2 was asked with that review and proposed the rule that was accepted
    (c,) = Candidates(kb).all()
    assert c["candidate"]["proposer"] == "llm:recorded-model" and c["candidate"]["round"] == 2
    assert c["rule"]["log"]["message"].startswith("nvme\\d+: controller fatal status")
    assert c["candidate"]["scores"]["test"]["fp"] == 0 and c["candidate"]["scores"]["test"]["recall"] == 1.0
    reasons = [x for r in result["causes"][0]["rejected"] for x in r["reasons"]]
    assert any("catastrophic" in x for x in reasons) and any("healthy windows" in x for x in reasons)
    assert len(llm.requests) == 2
    first, second = (r["messages"][-1]["content"] for r in llm.requests)
    assert "nvme0: controller fatal status <HEX>" in first and "Review of round 1" not in first
    assert "Review of round 1" in second and "catastrophic" in second and "healthy windows" in second
    assert llm.requests[0]["model"] == "recorded-model"


def test_garbage_answer_is_a_clear_error_and_nothing_is_written(history):
    h, kb = history
    with LocalLLM(RECORDINGS / "llm-recording-garbage.json") as llm:
        with pytest.raises(LearnError, match="the LLM answer is not JSON"):
            learn(h, kb, llm)
    assert not (kb / "candidates").exists()


def test_timeout_is_a_clear_error_alone_and_a_note_beside_the_deterministic_proposer(history):
    h, kb = history
    with LocalLLM(RECORDINGS / "llm-recording-nvme.json", delay_s=3.0) as llm:
        with pytest.raises(LearnError, match=r"did not answer within 1s \(llm.timeout_s\)"):
            learn(h, kb, llm, timeout_s=1.0)
        assert not (kb / "candidates").exists()
        result = learn(h, kb, llm, only=None, timeout_s=1.0)
    assert any("did not answer within 1s" in m for m in result["causes"][0]["messages"])
    (c,) = Candidates(kb).all()
    assert c["candidate"]["proposer"] == "deterministic"


def test_llm_proposer_needs_an_endpoint():
    from sigma.rules.learn.run import proposers_for

    with pytest.raises(LearnError, match="llm.base_url and llm.model"):
        proposers_for(LearnConfig(), only="llm")
    proposers, notes = proposers_for(LearnConfig())
    assert [p.name for p in proposers] == ["deterministic"] and "llm proposer skipped" in notes[0]
