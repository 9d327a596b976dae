"""The companion end to end on a real chaos soak's controller database (tests/fixtures/companion/soak.sql)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from sigma.companion.ask import ask
from sigma.companion.evaluate import evaluate, load_dump, load_questions, reference_time, summary
from sigma.companion.llm import LLMConfig, LLMTier
from sigma.companion.safe_sql import open_readonly
from sigma.companion.schema import schema_document, tables
from sigma.companion.timerange import find
from tests.conftest import FIXTURES
from tests.unit.llm_server import LocalLLM

DUMP = FIXTURES / "companion" / "soak.sql"
SETS = FIXTURES / "companion" / "questions"
BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture(scope="module")
def soak_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("companion") / "controller.db"
    load_dump(DUMP, path).close()
    return path


@pytest.fixture
def conn(soak_db):
    return open_readonly(soak_db)


def q(conn, question, **kw):
    return ask(conn, question, now=reference_time(conn), tz=BERLIN, **kw)


def test_the_sets_are_split_large_enough_and_every_ground_truth_runs(conn):
    sets = {p.stem: load_questions(p) for p in sorted(SETS.glob("*.yaml"))}
    assert set(sets) == {"built", "held_out", "held_out_2", "held_out_3", "held_out_4", "held_out_5", "held_out_6",
                         "held_out_7", "held_out_8", "held_out_9", "held_out_10",
                         "held_out_11", "held_out_12", "held_out_13", "held_out_14", "held_out_15", "held_out_16",
                         "held_out_17", "held_out_18", "held_out_19"}
    assert sum(map(len, sets.values())) >= 150
    built = {x.text for x in sets["built"]}
    for name, qs in sets.items():
        assert {x.tier for x in qs} == {"simple", "hard"} and any(x.refuse for x in qs), name
        if name != "built":
            assert not built & {x.text for x in qs}, f"{name} repeats built questions"
        for x in qs:
            if x.sql:
                conn.execute(x.sql).fetchall()


def test_no_refusal_is_answered_as_fact_and_no_simple_answer_is_wrong(conn):
    # held_out_2 and held_out_3 are measured by bench/companion.py only: a test failing on them would tell
    for name in ("built", "held_out"):
        questions = load_questions(SETS / f"{name}.yaml")
        scored = evaluate(conn, questions, tz=BERLIN)
        refusals = {x.text for x in questions if x.refuse}
        assert not [s.question for s in scored if s.question in refusals and s.status in ("fact", "model")], name
        assert summary(scored, "simple")["wrong_facts"] == 0, [s for s in scored if s.wrong_fact]


def test_the_fast_tier_answers_the_simple_questions_it_was_built_from(conn):
    scored = evaluate(conn, [x for x in load_questions(SETS / "built.yaml") if x.tier == "simple"], tz=BERLIN)
    assert summary(scored)["accuracy"] >= 0.9, [(s.question, s.detail) for s in scored if not s.right]


@pytest.mark.parametrize("question,word", [
    ("which nodes were drained by the janitor?", "janitor"),
    ("how many incidents on node2 per moon phase?", "moon"),
    ("how many incidents did the quantum flux capacitor cause?", "quantum"),
    ("which drains happened while the moon was full?", "moon"),
])
def test_a_word_not_understood_is_never_answered_as_fact(conn, question, word):
    a = q(conn, question)
    assert a.status in ("partial", "cannot") and not a.rows and not a.sql
    assert any(word in w for w in a.not_understood) and "I" in a.text


def test_questions_back_and_refusals(conn):
    assert q(conn, "what state is node9 in?").status == "clarify"
    assert "Which job" in q(conn, "why did my job restart?").text
    a = q(conn, "drain node3 now")
    assert a.status == "cannot" and "only read" in a.text and not a.rows
    job = conn.execute("SELECT job_id FROM kpis GROUP BY job_id ORDER BY COUNT(*) DESC").fetchone()[0]
    assert q(conn, f"what's the step of job {job}?").status == "clarify"   # kpis and checkpoints both have a step
    assert q(conn, "   ").status == "clarify"
    b = q(conn, "how many nodes were drained more than twice this year, per moon phase?")
    assert b.status != "fact"


def test_compositions_over_the_schema(conn):
    a = q(conn, "which jobs were requeued more than once?")
    assert a.status == "fact" and sorted((r[0],) for r in a.rows) == values(
        conn, "SELECT CAST(target AS INTEGER) FROM actions WHERE kind = 'requeue' AND state = 'done' GROUP BY target "
              "HAVING COUNT(*) > 1")
    b = q(conn, "median time out of service per node in the last 3 hours")
    assert b.status == "fact" and "ROW_NUMBER" in b.sql
    c = q(conn, "which node logged the most warning or error events?")   # values as alternatives, ties all kept
    assert sorted((r[0],) for r in c.rows) == values(
        conn, "WITH n AS (SELECT node, COUNT(*) AS n FROM events WHERE severity IN ('warning', 'error') GROUP BY node) "
              "SELECT node FROM n WHERE n = (SELECT MAX(n) FROM n)")
    d = q(conn, "how many Xid 79 events have we seen?")
    assert "events" in d.sql and d.rows == values(
        conn, "SELECT COUNT(*) FROM events WHERE kind = 'xid' AND json_extract(fields, '$.xid') = 79")
    e = q(conn, "did any restart lose more than 10 steps?")
    lost = values(conn, "SELECT a.id FROM actions a WHERE a.kind = 'requeue' AND a.state = 'done' AND (SELECT "
                        "MAX(step) FROM kpis k WHERE k.job_id = CAST(a.target AS INTEGER) AND k.ts <= a.done_at) "
                        "- (SELECT json_extract(e.fields, '$.step') FROM events e WHERE e.source = 'kpi' AND e.kind "
                        "IN ('start', 'resume') AND e.ts > a.done_at AND EXISTS (SELECT 1 FROM json_each(e.job_ids) j "
                        "WHERE j.value = CAST(a.target AS INTEGER)) ORDER BY e.ts LIMIT 1) > 10")
    assert e.status == "fact" and len(e.rows) == len(lost) and e.text.startswith("Yes" if lost else "No")


def test_negation_excludes_and_never_is_the_others(conn):
    a = q(conn, "how many incidents on node2 excluding xid?")
    assert a.status == "fact" and "NOT COALESCE" in a.sql and a.rows == values(
        conn, "SELECT COUNT(*) FROM incidents WHERE node = 'node2' AND rule_id NOT LIKE 'gpu-xid-%'")
    b = q(conn, "list the incidents whose status is not resolved or confirmed")   # neither
    assert sorted((r[0],) for r in b.rows) == values(
        conn, "SELECT id FROM incidents WHERE status NOT IN ('resolved', 'confirmed')")
    c = q(conn, "which nodes were never drained?")
    assert c.status == "fact" and sorted((r[0],) for r in c.rows) == values(
        conn, "SELECT DISTINCT node FROM node_snapshots WHERE node NOT IN (SELECT target FROM actions WHERE "
              "kind = 'drain' AND state = 'done')")


def clock(ts: float, tz=BERLIN) -> str:
    return datetime.fromtimestamp(ts, tz).strftime("%H:%M")


def test_time_ranges_are_read_in_the_sites_timezone(conn):
    opened = [r[0] for r in conn.execute("SELECT opened_at FROM incidents ORDER BY opened_at")]
    start = opened[len(opened) // 2] // 60 * 60   # a window of three minutes in the middle of the data
    want = values(conn, f"SELECT id FROM incidents WHERE opened_at >= {start} AND opened_at < {start + 180}")
    berlin = q(conn, f"which incidents opened between {clock(start)} and {clock(start + 180)}?")
    assert berlin.status == "fact" and sorted((r[0],) for r in berlin.rows) == want
    utc = ask(conn, f"which incidents opened between {clock(start, ZoneInfo('UTC'))} and "
                    f"{clock(start + 180, ZoneInfo('UTC'))}?", now=reference_time(conn), tz=ZoneInfo("UTC"))
    assert sorted((r[0],) for r in utc.rows) == want
    first = datetime.fromtimestamp(min(r[1] for r in berlin.rows), BERLIN).strftime("%H:%M:%S %Z")
    assert first in berlin.text     # and answered in it
    now = datetime(2026, 11, 23, 20, 0, tzinfo=BERLIN).timestamp()  # a Monday
    for words, start, end in [("in the last 2 hours", "2026-11-23 18:00", None),
                              ("yesterday", "2026-11-22 00:00", "2026-11-23 00:00"),
                              ("since tuesday", "2026-11-17 00:00", None), ("this week", "2026-11-23 00:00", None),
                              ("since yesterday", "2026-11-22 00:00", None),
                              ("since 2 hours ago", "2026-11-23 18:00", None),
                              ("last week", "2026-11-16 00:00", "2026-11-23 00:00"),
                              ("between 10:00 and 10:30", "2026-11-23 10:00", "2026-11-23 10:30"),
                              ("this afternoon", "2026-11-23 12:00", "2026-11-23 18:00"),
                              ("yesterday evening", "2026-11-22 18:00", "2026-11-23 00:00")]:
        r = find(words, now, BERLIN)
        at = lambda s: datetime.fromisoformat(s).replace(tzinfo=BERLIN).timestamp()  # noqa: E731
        assert (r.since, r.until) == (at(start), at(end) if end else None), words


def test_what_a_drain_would_hit(conn):
    jobs = {node: json.loads(js) for node, js in conn.execute(
        "SELECT node, jobs FROM node_snapshots n WHERE ts = (SELECT MAX(ts) FROM node_snapshots m "
        "WHERE m.node = n.node)")}
    for node, running in sorted(jobs.items()):
        a = q(conn, f"if I drain {node} now, which jobs are affected?")
        assert a.status == "fact" and f"Draining {node} now" in a.text
        assert a.rows == [(node, j) for j in sorted(running)] and (running or "no job" in a.text)


def values(conn, sql):
    return sorted(tuple(round(v, 3) if isinstance(v, float) else v for v in r) for r in conn.execute(sql))


def test_words_with_several_readings_are_asked_back_and_readings_that_agree_answered(conn):
    a = q(conn, "which node went down?")   # a SLURM state (reboots too) or a node that stopped responding
    assert a.status == "clarify" and not a.rows and not a.sql
    assert "SLURM state" in a.text and "slurm-node-not-responding" in a.text
    b = q(conn, "how long was node2 down?")   # the SLURM-state reading has no duration: said, not dropped
    assert b.status == "clarify" and "not one I can answer" in b.text
    c = q(conn, "which jobs reported a NaN loss?")   # incidents, restarts and actions of that rule agree
    assert c.status == "fact"
    d = q(conn, "what state is node3 in?")   # the schema document's "state" (SLURM's), not a learnt column name
    assert d.status == "fact" and "node_snapshots" in d.sql
    e = q(conn, "is node3 drained?")   # present tense: the current state, not the history of drains
    now = values(conn, "SELECT node FROM node_snapshots n WHERE node = 'node3' AND flags LIKE '%DRAIN%' AND "
                       "ts = (SELECT MAX(ts) FROM node_snapshots m WHERE m.node = n.node)")
    assert e.status == "fact" and "node_snapshots" in e.sql and e.text.startswith("Yes" if now else "No")


def test_a_noun_naming_an_entity_is_the_entity_answered_about(conn):
    # "events" ends the rule id kpi-nan-loss-event too: the noun is the question's subject, not part of a rule name
    a = q(conn, "how many nan loss events were there?")
    assert a.status == "fact" and "FROM events" in a.sql and a.rows == values(
        conn, "SELECT COUNT(*) FROM events WHERE kind = 'nan_loss'")


def test_a_fault_name_of_two_entities_with_no_noun_to_choose_is_asked_back(conn):
    # "xid errors": the xid rules' incidents, or logged events of kind xid; their counts per node differ
    a = q(conn, "for each node, how many xid errors in the last 2 hours?")
    assert a.status == "clarify" and not a.rows and "incidents" in a.text and "kind xid" in a.text
    b = q(conn, "how many xid events were there?")   # the noun chooses
    assert b.status == "fact" and b.rows == values(conn, "SELECT COUNT(*) FROM events WHERE kind = 'xid'")
    c = q(conn, "which nodes failed their prolog?")   # a fault's name filters drains too: no reading of its own
    assert c.status == "fact" and "health" in c.text


def test_a_column_measured_and_grouped_by_at_once_is_no_answer(conn):
    a = q(conn, "what training step did job 1 reach?")   # read as "max step per step": one group per value
    assert a.status != "fact" and not a.rows, (a.status, a.text)


def test_a_count_in_words_is_the_count_in_digits(conn):
    for question in ("top {} rules by how many incidents they opened", "the {} rules with the most incidents"):
        words, digits = q(conn, question.format("three")), q(conn, question.format(3))
        assert words.status == digits.status == "fact" and words.rows == digits.rows and len(words.rows) == 3


def test_function_words_another_entity_names_are_read_as_function_words_only_before_a_time(conn):
    a = q(conn, "number of requeues done so far")   # "done": a drain's column, here only the verb
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT COUNT(*) FROM actions WHERE kind = 'requeue' AND state = 'done'")
    assert q(conn, "how many incidents done?").status == "partial"   # done: closed? not guessed
    b = q(conn, "what rules have fired against node4?")
    assert b.status == "fact" and sorted(r[:1] for r in b.rows) == values(
        conn, "SELECT DISTINCT rule_id FROM incidents WHERE node = 'node4'")


def test_how_many_times_counts_a_history_not_a_current_state(conn):
    a = q(conn, "how many times has node2 entered remediation?")   # not node_lifecycle's one row for node2
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT COUNT(*) FROM lifecycle_transitions WHERE node = 'node2' AND to_state = 'remediating'")


def test_an_aggregate_per_the_entitys_own_name_is_over_its_rows(conn):
    a = q(conn, "median time lost per job loss")
    assert a.status == "fact" and a.rows == values(
        conn, "WITH x AS (SELECT time_lost_s AS s FROM job_losses WHERE time_lost_s IS NOT NULL) SELECT AVG(s) FROM "
              "(SELECT s FROM x ORDER BY s LIMIT 2 - (SELECT COUNT(*) FROM x) % 2 OFFSET ((SELECT COUNT(*) FROM x) - 1)"
              " / 2)")
    assert q(conn, "how many incidents per incident").status == "partial"   # no aggregate over rows: not read


def test_a_ranking_lists_every_group_largest_first(conn):
    a = q(conn, "rank the nodes by total time lost")
    assert a.status == "fact" and a.rows == [tuple(r) for r in conn.execute(
        "SELECT i.node, SUM(l.time_lost_s) AS s FROM job_losses l JOIN incidents i ON i.id = l.incident_id "
        "WHERE i.node <> '' GROUP BY i.node ORDER BY s DESC")]


def test_a_group_key_of_empty_text_is_no_group(conn):
    """An incident with no category ('' as well as NULL) is no category of its own, also as a referred row's."""
    assert values(conn, "SELECT COUNT(*) FROM incidents WHERE category = ''")[0][0] > 0   # the case is there
    a = q(conn, "incident count per category, biggest first")
    assert a.status == "fact" and values_of(a) == values(
        conn, "SELECT category, COUNT(*) FROM incidents WHERE category <> '' GROUP BY category")
    b = q(conn, "total time lost per incident category")
    assert b.status == "fact" and "" not in {r[0] for r in b.rows} and None not in {r[0] for r in b.rows}


def test_a_metric_names_words_are_not_an_aggregate_and_two_aggregates_of_one_value_are_not_understood(conn):
    top = values(conn, "SELECT MAX(value) FROM samples WHERE node = 'node4' AND metric = 'host.load1'")
    a = q(conn, "what was the highest 1-minute load average on node4?")   # "load average": the metric's name
    assert a.status == "fact" and values_of(a) == top
    b = q(conn, "what was the average highest 1-minute load on node4?")   # one value: average or highest?
    assert b.status == "partial" and not b.rows


def test_a_value_word_after_another_values_name_is_asked_back_where_it_leaves_none(conn):
    """'errors' after a source's name may be the events' noun, not a severity: asked back where the readings
    differ; after a kind's name it is the kind's noun (the AER events are warnings: 'AER errors' are all of them)."""
    assert not values(conn, "SELECT 1 FROM events WHERE kind = 'pcie_aer' AND severity = 'error'")
    for question in ("which nodes reported PCIe AER errors?", "how many PCIe AER errors?"):
        a = q(conn, question)
        assert a.status == "fact" and a.rows and "severity" not in a.understood
    a = q(conn, "how many sidecar errors?")
    assert a.status == "clarify" and not a.rows and "'errors' read as part of the name" in a.text
    b = q(conn, "how many times did the prolog reject a node?")   # the condition leaves rows: it is one
    assert b.status == "fact" and b.rows == values(
        conn, "SELECT COUNT(*) FROM events WHERE source = 'health' AND kind = 'suite.prolog' AND severity = 'reject'")


def test_time_lost_is_answered_with_the_time_lost_or_not_as_fact(conn):
    """'time' names a time measure: never the steps lost in its place, nor the count 'times'."""
    def most(per):   # the keys with the largest total time lost, and that total
        return values(conn, f"WITH t AS (SELECT {per} AS k, SUM(l.time_lost_s) AS v FROM job_losses l JOIN incidents i "
                            "ON i.id = l.incident_id WHERE k IS NOT NULL GROUP BY k) SELECT k, v FROM t "
                            "WHERE v = (SELECT MAX(v) FROM t)")
    for question, per in (("which node lost the most time?", "i.node"), ("which job lost the most time?", "l.job_id"),
                          ("which node lost the most training time?", "i.node"),
                          ("which rule cost the most time?", "i.rule_id")):   # what a fault costs is what it lost
        a = q(conn, question)
        assert a.status == "fact" and values_of(a) == most(per), (question, a.text)
    a = q(conn, "time lost per node")
    assert a.status == "fact" and values_of(a) == values(
        conn, "SELECT i.node, SUM(l.time_lost_s) FROM job_losses l JOIN incidents i ON i.id = l.incident_id "
              "WHERE i.node IS NOT NULL GROUP BY i.node")
    steps = q(conn, "which node lost the most steps?")   # the KPIs' account and the controller's agree here
    assert steps.status == "fact" and sorted(r[0] for r in steps.rows) == [r[0] for r in values(
        conn, "WITH t AS (SELECT i.node AS k, SUM(l.steps_lost) AS v FROM job_losses l JOIN incidents i ON "
              "i.id = l.incident_id WHERE i.node IS NOT NULL GROUP BY k) SELECT k FROM t WHERE v = (SELECT MAX(v) "
              "FROM t)")]
    # steps or time, unsaid: asked back; a word not understood ("squandered"): not an answer
    for question in ("which node lost the most?", "which rule squandered the most time?"):
        assert q(conn, question).status in ("clarify", "partial"), question


def values_of(a):
    return sorted(tuple(round(v, 3) if isinstance(v, float) else v for v in r) for r in a.rows)


def assert_answers(conn, question, sql):
    """The question is answered as fact, with the rows of the SQL written for it (its leading columns)."""
    a = q(conn, question)
    want = values(conn, sql)
    assert a.status == "fact" and sorted(r[:len(want[0])] for r in values_of(a)) == want, (a.understood, a.rows)


def test_one_value_of_several_rows_is_the_default_an_admin_means_and_says_so(conn):
    outages = values(conn, "SELECT COUNT(*), SUM((SELECT MIN(r.ts) FROM lifecycle_transitions r WHERE r.node = d.node "
                           "AND r.cycle = d.cycle AND r.to_state = 'resumed') - d.ts) FROM lifecycle_transitions d "
                           "WHERE node = 'node2' AND to_state = 'drained'")
    f = q(conn, "how long was node2 out of service?")   # a time that adds up: the total, with how many
    assert outages[0][0] > 1 and f.status == "fact" and f"the total of {outages[0][0]}" in f.text
    assert [(round(f.rows[0][0], 3),)] == [outages[0][1:]] and "'each'" in f.text
    back = values(conn, "SELECT COUNT(*), MAX(ts) FROM lifecycle_transitions WHERE node = 'node1' "
                        "AND to_state = 'resumed'")
    g = q(conn, "when did node1 come back into service?")   # one time: the last, with how many
    assert g.status == "fact" and round(g.rows[0][0], 3) == back[0][1] and f"the last of {back[0][0]}" in g.text
    h = q(conn, "how long did detection take for xid errors?")   # a latency: the average
    assert h.status == "fact" and "the average of" in h.text and [(round(h.rows[0][0], 3),)] == values(
        conn, "SELECT AVG(opened_at - fault_ts) FROM incidents WHERE rule_id LIKE 'gpu-xid-%'")
    i = q(conn, "when were the drains on node2?")   # named in the plural: every one
    assert i.status == "fact" and len(i.rows) == values(
        conn, "SELECT COUNT(*) FROM actions WHERE kind = 'drain' AND state = 'done' AND target = 'node2'")[0][0]


def test_relations_second_parts_and_derived_measures_match_independent_sql(conn):
    a = q(conn, "which incidents were not followed by any action?")
    assert a.status == "fact" and sorted(r[0] for r in a.rows) == [r[0] for r in values(
        conn, "SELECT id FROM incidents i WHERE NOT EXISTS (SELECT 1 FROM actions a WHERE a.incident_id = i.id)")]
    b = q(conn, "how many incidents per rule, and how many of them led to a drain?")
    assert b.status == "fact" and sorted(b.rows) == values(
        conn, "SELECT rule_id, COUNT(*), SUM(EXISTS (SELECT 1 FROM actions a WHERE a.incident_id = i.id AND "
              "a.kind = 'drain' AND a.state = 'done')) FROM incidents i GROUP BY rule_id")
    c = q(conn, "what was the average time between the fault and the requeue?")
    want = values(conn, "SELECT AVG(a.done_at - i.fault_ts) FROM actions a JOIN incidents i ON i.id = a.incident_id "
                        "WHERE a.kind = 'requeue' AND a.state = 'done'")
    assert c.status == "fact" and [tuple(round(v, 3) for v in c.rows[0])] == want
    d = q(conn, "what is the minimum available memory on node3, in GiB?")
    assert d.status == "fact" and "GiB" in d.text and round(d.rows[0][0], 3) == values(
        conn, "SELECT MIN(value) / 1073741824.0 FROM samples WHERE node = 'node3' AND "
              "metric = 'host.mem.available_bytes'")[0][0]
    e = q(conn, "which incidents mention 'culprit' in their summary?")
    assert e.status == "fact" and sorted(r[0] for r in e.rows) == [r[0] for r in values(
        conn, "SELECT id FROM incidents WHERE summary LIKE '%culprit%'")]
    f = q(conn, "how many different rules fired on node2 versus node1?")
    assert f.status == "fact" and sorted(f.rows) == values(
        conn, "SELECT node, COUNT(DISTINCT rule_id) FROM incidents WHERE node IN ('node1', 'node2') GROUP BY node")
    g = q(conn, "total time lost per node")   # a loss's node is its fault's: through the loss's incident
    assert g.status == "fact" and sorted((n, round(v, 3)) for n, v in g.rows) == values(
        conn, "SELECT i.node, SUM(l.time_lost_s) FROM job_losses l JOIN incidents i ON i.id = l.incident_id "
              "WHERE i.node IS NOT NULL GROUP BY i.node")
    for question in ("how many incidents per rule, and how many of them made coffee?",   # a part not understood
                     "which incidents were followed by a moon landing?"):
        assert q(conn, question).status != "fact", question


@pytest.mark.parametrize("question", [
    "how many failures did node2 have?",          # incidents, or failed health checks: their counts differ
    "what stage was node2 in?",                   # one of several stages, no word says which
    "which jobs run on node2 if we look now?",    # a what-if whose action is not understood
    "how many GPU hours did the faults cost?",    # no GPU count per job or node in the data
    "which node should I replace first?",         # a judgement, not a record
    "who rebooted node2?",                        # no person is recorded against an action
])
def test_the_right_answer_is_i_cannot_or_a_question_back(conn, question):
    a = q(conn, question)
    assert a.status in ("clarify", "partial", "cannot") and not a.rows, (a.status, a.text)


def test_what_the_question_names_is_what_the_answer_holds(conn):
    a = q(conn, "what remediation stage is node2 in?")   # one value now: the history's latest row, not a count each
    assert a.status == "fact" and len(a.rows) == 1 and a.rows[0][a.columns.index("stage")] == values(
        conn, "SELECT state FROM node_lifecycle WHERE node = 'node2'")[0][0]
    b = q(conn, "when was the last incident on each node?")   # no group for the incidents without a node
    assert b.status == "fact" and values_of(b) == values(
        conn, "SELECT node, MAX(opened_at) FROM incidents WHERE node IS NOT NULL GROUP BY node")
    c = q(conn, "how many actions failed?")   # a state the schema lists that no row has: none, as fact
    assert c.status == "fact" and c.rows == [(0,)]
    d = q(conn, "which rules fired on more than one node?")
    assert d.status == "fact" and sorted(r[:1] for r in d.rows) == values(
        conn, "SELECT rule_id FROM incidents GROUP BY rule_id HAVING COUNT(DISTINCT node) > 1")
    e = q(conn, "which jobs are at risk if I take node3 out of service now?")
    assert e.status == "fact" and sorted(r[1:] for r in e.rows) == values(
        conn, "SELECT j.value FROM node_snapshots n, json_each(n.jobs) j WHERE n.node = 'node3' AND "
              "n.ts = (SELECT MAX(ts) FROM node_snapshots m WHERE m.node = n.node)")


@pytest.mark.parametrize("question,sql", [
    ("how many incidents have not been closed yet?", "SELECT COUNT(*) FROM incidents WHERE closed_at IS NULL"),
    ("which nodes had a kernel hard lockup?",        # a rule id in its own words
     "SELECT DISTINCT node FROM incidents WHERE rule_id = 'kernel-hard-lockup'"),
    ("how many health checks timed out?",            # a value 'timeout' in the words people write
     "SELECT COUNT(*) FROM events WHERE source = 'health' AND severity = 'timeout'"),
    ("top 3 rules by number of incidents",
     "SELECT rule_id FROM incidents GROUP BY rule_id ORDER BY COUNT(*) DESC, rule_id LIMIT 3"),
    ("what was the longest any node spent in validation?",
     "SELECT MAX((SELECT MIN(r.ts) FROM lifecycle_transitions r WHERE r.node = v.node AND r.cycle = v.cycle AND "
     "r.ts > v.ts) - v.ts) FROM lifecycle_transitions v WHERE v.to_state = 'validating'"),
])
def test_compositions_of_words_the_schema_gives(conn, question, sql):
    assert_answers(conn, question, sql)


@pytest.mark.parametrize("question,sql", [
    # words around a question that carry no condition: the site as subject, no bound in time, a copula, "filed"
    ("how many drains has node2 had so far?",
     "SELECT COUNT(*) FROM actions WHERE kind = 'drain' AND state = 'done' AND target = 'node2'"),
    ("what's the highest detection latency we've seen?", "SELECT MAX(opened_at - fault_ts) FROM incidents"),
    ("how many reboots have we done?", "SELECT COUNT(*) FROM actions WHERE kind = 'reboot' AND state = 'done'"),
    ("how many incidents are flagged as closed?", "SELECT COUNT(*) FROM incidents WHERE closed_at IS NOT NULL"),
    ("how many reservations were filed?",
     "SELECT COUNT(*) FROM actions WHERE kind = 'create_reservation' AND state = 'done'"),
    # a time that is not there; a duration named by its end time's word (acked_at: "ack")
    ("how many checkpoint requests never got delivered?",
     "SELECT COUNT(*) FROM checkpoint_requests WHERE delivered_at IS NULL"),
    ("what was the longest ack time?", "SELECT MAX(acked_at - requested_at) FROM checkpoint_requests"),
    # a phrase's words apart ("time ... lose") or in another order ("ambiguous isolation")
    ("how much training time has job 1 lost so far?", "SELECT SUM(time_lost_s) FROM job_losses WHERE job_id = 1"),
    ("how many ambiguous isolation incidents did node2 have?",
     "SELECT COUNT(*) FROM incidents WHERE rule_id = 'isolation-ambiguous' AND node = 'node2'"),
    # what one row is ("per drain"), a related entity's name on a column ("recovery source")
    ("how long was node2 out of service on average per drain?",
     "SELECT AVG(r.ts - d.ts) FROM lifecycle_transitions d JOIN lifecycle_transitions r ON r.node = d.node AND "
     "r.cycle = d.cycle AND r.to_state = 'resumed' WHERE d.to_state = 'drained' AND d.node = 'node2'"),
    ("total time lost per recovery source", "SELECT source, SUM(time_lost_s) FROM job_losses GROUP BY source"),
    # a category of the row this one refers to, by that table's noun ("incident severity" of a drain)
    ("how many drains per incident severity?",
     "SELECT i.severity, COUNT(*) FROM actions a JOIN incidents i ON i.id = a.incident_id WHERE a.kind = 'drain' "
     "AND a.state = 'done' GROUP BY i.severity"),
    ("which incident severity cost job 1 the most time?",   # the most: the total per severity, not one loss's
     "WITH t AS (SELECT i.severity, SUM(l.time_lost_s) AS s FROM job_losses l JOIN incidents i ON i.id = "
     "l.incident_id WHERE l.job_id = 1 GROUP BY i.severity) SELECT severity FROM t WHERE s = (SELECT MAX(s) FROM t)"),
    # everyday verbs: a copula, a verb of being, a grouping verb around its object, the whole cluster
    ("how many drains are sitting in shadow mode?",
     "SELECT COUNT(*) FROM actions WHERE kind = 'drain' AND state = 'shadow'"),
    ("how many incidents turned out to be closed?", "SELECT COUNT(*) FROM incidents WHERE closed_at IS NOT NULL"),
    ("split the incidents up by severity", "SELECT severity, COUNT(*) FROM incidents GROUP BY severity"),
    ("how many actions per state?", "SELECT state, COUNT(*) FROM actions GROUP BY state"),   # every state
    ("the average detection latency across the whole cluster", "SELECT AVG(opened_at - fault_ts) FROM incidents"),
    # a period word repeating the buckets' ("oldest hour first"), a stated period kept over "trend"
    ("mean loss of job 1 per hour, oldest hour first",
     "SELECT CAST(ts / 3600 AS INTEGER) * 3600, AVG(loss) FROM kpis WHERE job_id = 1 GROUP BY 1"),
    ("hourly trend of job 1's loss", "SELECT CAST(ts / 3600 AS INTEGER) * 3600, AVG(loss) FROM kpis WHERE job_id = 1 "
                                     "GROUP BY 1"),
    # two times of one row: compared ("by", "after" the deadline; negated, the never acked too), or the span from
    # one to the other, where the row's own name is its own time (an incident's: its opening)
    ("how many checkpoint requests were not acknowledged by the deadline?",
     "SELECT COUNT(*) FROM checkpoint_requests WHERE acked_at IS NULL OR acked_at > deadline"),
    ("which checkpoint requests were acked after the deadline?",
     "SELECT id FROM checkpoint_requests WHERE acked_at > deadline"),
    # an action state the entity's default leaves out, named ("failed"); every group ranked, largest first
    ("how many reboots were skipped?", "SELECT COUNT(*) FROM actions WHERE kind = 'reboot' AND state = 'skipped'"),
    ("rank the rules by how many incidents they raised",
     "SELECT rule_id, COUNT(*) FROM incidents GROUP BY rule_id"),
    ("the median time from fault to incident", "WITH x AS (SELECT opened_at - fault_ts AS s FROM incidents WHERE "
     "fault_ts IS NOT NULL) SELECT AVG(s) FROM (SELECT s FROM x ORDER BY s LIMIT 2 - (SELECT COUNT(*) FROM x) % 2 "
     "OFFSET ((SELECT COUNT(*) FROM x) - 1) / 2)"),
    # the time apart, whichever end is named first (never a negative duration)
    ("the average time between the incident and the fault",
     "SELECT AVG(opened_at - fault_ts) FROM incidents WHERE fault_ts IS NOT NULL"),
])
def test_everyday_words_and_phrases_apart_are_understood(conn, question, sql):
    assert_answers(conn, question, sql)


@pytest.mark.parametrize("question,word", [
    ("how many new drains?", "new"),                            # new since when?
    ("how many incidents are marked?", "marked"),               # marked what?
    ("how many incidents have we bungled so far?", "bungled"),  # a content word still unknown
    ("how many incidents per hour, newest day first?", "day"),   # a period that is not the buckets'
])
def test_words_that_need_their_other_half_are_not_answered_alone(conn, question, word):
    a = q(conn, question)
    assert a.status != "fact" and not a.rows and word in a.not_understood, (a.status, a.text)


def test_a_new_column_is_understood_without_new_code(soak_db, tmp_path):
    db = tmp_path / "controller.db"
    shutil.copy(soak_db, db)
    rw = sqlite3.connect(db)
    rw.execute("ALTER TABLE incidents ADD COLUMN gpu_temp_c REAL")
    rw.execute("UPDATE incidents SET gpu_temp_c = 60 + id")
    rw.commit()
    rw.close()
    conn = open_readonly(db)
    a = q(conn, "what was the highest gpu temp c of the incidents on node2?")
    assert a.status == "fact" and a.rows == values(conn, "SELECT MAX(60.0 + id) FROM incidents WHERE node = 'node2'")


def test_the_schema_document_follows_the_migrations():
    from sigma.controller.db import MIGRATIONS
    from sigma.store import migrate

    fresh = sqlite3.connect(":memory:")
    migrate(fresh, MIGRATIONS)
    doc = schema_document()
    for t in tables():
        assert [c.name for c in t.columns] == [r[1] for r in fresh.execute(f"PRAGMA table_info({t.name})")]
        assert f"TABLE {t.name}" in doc
    assert "earliest evidence" in doc and "batches" not in {t.name for t in tables()}


def test_cli_shows_how_it_read_the_question_and_the_sql(soak_db, capsys, monkeypatch):
    from sigma.cli import main

    monkeypatch.delenv("SIGMA_LLM_BASE_URL", raising=False)
    assert main(["ask", "--db", str(soak_db), "--tz", "Europe/Berlin", "--show-sql", "how", "many", "reboots",
                 "were", "there?"]) == 0
    out = capsys.readouterr().out
    n = sqlite3.connect(soak_db).execute("SELECT COUNT(*) FROM actions WHERE kind = 'reboot' AND state = 'done'")
    assert f"{n.fetchone()[0]} reboot" in out and "read as: reboots" in out and "fast tier: WITH" in out
    assert main(["ask", "--db", str(soak_db), "--json", "what state is node3 in?"]) == 0
    data = json.loads(capsys.readouterr().out)
    state = sqlite3.connect(soak_db).execute("SELECT state FROM node_snapshots WHERE node = 'node3' ORDER BY ts DESC")
    assert data["status"] == "fact" and data["rows"][0][:2] == ["node3", state.fetchone()[0]]


# ---------- the language-model tier, over the real OpenAI protocol, replaying recorded responses ----------

def test_llm_tier_replays_a_recording_repairs_the_query_and_labels_the_answer(conn, soak_db):
    before = hashlib.sha256(soak_db.read_bytes()).hexdigest()
    with LocalLLM(FIXTURES / "companion" / "llm-recording-repair.json") as server:
        tier = LLMTier(LLMConfig(server.base_url, "recorded", api_key="k"))
        a = q(conn, "how many incidents per rule, and how many of those ended up with their node drained?", llm=tier)
    assert a.tier == "llm" and a.status == "model" and a.attempts == 2
    recorded = json.loads((FIXTURES / "companion" / "llm-recording-repair.json").read_text())["responses"][1]
    sql = recorded["choices"][0]["message"]["content"].strip("`\nsql")
    assert a.text.startswith("Language model's answer") and sorted(a.rows) == sorted(conn.execute(sql).fetchall())
    first = server.requests[0]
    assert first["model"] == "recorded" and server.headers[0]["authorization"] == "Bearer k"
    assert "TABLE incidents" in first["messages"][0]["content"]
    assert "read parts of it as: incidents" in first["messages"][-1]["content"]   # the fast tier's reading
    assert "no such column: nodename" in server.requests[1]["messages"][-1]["content"]
    assert hashlib.sha256(soak_db.read_bytes()).hexdigest() == before


def test_a_question_the_fast_tier_answers_never_waits_for_the_model(conn):
    with LocalLLM(replies=["```sql\nSELECT 1\n```"]) as server:
        a = q(conn, "how many reboots were there?", llm=LLMTier(LLMConfig(server.base_url, "m")))
    assert a.tier == "fast" and server.requests == [] and a.rows == values(
        conn, "SELECT COUNT(*) FROM actions WHERE kind = 'reboot' AND state = 'done'")


def test_a_hostile_model_changes_nothing_and_the_user_is_told(conn, soak_db):
    before = hashlib.sha256(soak_db.read_bytes()).hexdigest()
    incidents = sqlite3.connect(soak_db).execute("SELECT COUNT(*) FROM incidents").fetchone()[0]
    replies = ["```sql\nDROP TABLE incidents\n```", "```sql\nATTACH DATABASE '/tmp/x' AS x\n```",
               "```sql\nSELECT readfile('/etc/passwd')\n```"]
    with LocalLLM(replies=replies) as server:
        tier = LLMTier(LLMConfig(server.base_url, "m", max_attempts=3))
        a = q(conn, "what is the meaning of the universe on node3?", llm=tier)
    assert a.status != "fact" and "could not answer" in a.text and "no runnable query after 3 attempts" in a.text
    assert hashlib.sha256(soak_db.read_bytes()).hexdigest() == before
    assert sqlite3.connect(soak_db).execute("SELECT COUNT(*) FROM incidents").fetchone()[0] == incidents


def test_a_slow_endpoint_times_out_into_a_plain_answer(conn):
    with LocalLLM(replies=["```sql\nSELECT 1\n```"], delay_s=2.0) as server:
        tier = LLMTier(LLMConfig(server.base_url, "m", timeout_s=0.3))
        a = q(conn, "compare the detection latency of rule-based and watchdog incidents", llm=tier)
    assert "could not answer" in a.text and "Timeout" in a.text and a.status != "fact"


def test_an_empty_database_is_answered_not_guessed(tmp_path):
    from sigma.controller.db import open_db

    open_db(tmp_path / "controller.db").close()
    conn = open_readonly(tmp_path / "controller.db")
    assert ask(conn, "how many incidents were there today?").rows == [(0,)]
    assert ask(conn, "did any job lose more than 10 steps?").text.startswith("No")
    assert ask(conn, "how long was node2 out of service?").status == "clarify"   # no node2 seen yet


def test_everyday_verbs_around_an_understood_question_carry_no_condition(conn):
    # a verb of appearing ("turned up", "popped up"), a reflexive pronoun, and a verb of making whose meaning in
    # another entity is a time: every row there did, so nothing is filtered
    a = q(conn, "how many xid events turned up on node3?")
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT COUNT(*) FROM events WHERE kind = 'xid' AND node = 'node3'")
    b = q(conn, "how many incidents did the watchdog itself file?")
    assert b.status == "fact" and b.rows == values(conn, "SELECT COUNT(*) FROM incidents WHERE source = 'watchdog'")
    assert q(conn, "how many xid events turned down on node3?").status == "partial"   # "down" is no appearing


def test_a_relation_word_before_the_rows_own_value_says_what_they_became(conn):
    a = q(conn, "how many actions ended up in shadow mode?")
    assert a.status == "fact" and a.rows == values(conn, "SELECT COUNT(*) FROM actions WHERE state = 'shadow'")
    assert q(conn, "how many incidents ended up in node3?").status == "partial"   # a node is no value of theirs


def test_a_total_of_rows_with_no_measure_is_their_number(conn):
    a = q(conn, "total reboots to date")
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT COUNT(*) FROM actions WHERE kind = 'reboot' AND state = 'done'")
    b = q(conn, "total incidents per node")
    assert b.status == "fact" and sorted(b.rows) == values(
        conn, "SELECT node, COUNT(*) FROM incidents WHERE node IS NOT NULL GROUP BY node ORDER BY node")


def test_by_before_a_single_row_is_the_row_that_did_it(conn):
    a = q(conn, "the most time lost by a single job loss")
    assert a.status == "fact" and a.rows == values(conn, "SELECT MAX(time_lost_s) FROM job_losses")


def test_a_weak_noun_after_a_kinds_name_is_its_noun_whatever_the_severity(conn):
    a = q(conn, "how many PCIe AER errors were logged?")   # the AER events are warnings: every one is meant
    assert a.status == "fact" and a.rows == values(conn, "SELECT COUNT(*) FROM events WHERE kind = 'pcie_aer'")


def test_the_rules_listed_are_the_rules_own_entitys_unless_another_is_named(conn):
    a = q(conn, "what rules are running in shadow mode?")   # rules fire incidents; drains and actions only carry one
    assert a.status == "fact" and sorted(r[:1] for r in a.rows) == values(
        conn, "SELECT DISTINCT rule_id FROM incidents WHERE status = 'shadow' ORDER BY rule_id")
    b = q(conn, "which rules ran in shadow mode, and which actions would they have taken?")
    assert b.status == "clarify"   # the second part names actions: their reading stays, and the answers differ


def test_rank_or_sort_before_a_reference_lists_every_group_and_most_first_is_an_order(conn):
    expected = [tuple(r) for r in conn.execute(
        "SELECT node, COUNT(*) AS n FROM incidents WHERE node IS NOT NULL GROUP BY node ORDER BY n DESC, node")]
    for question in ("sort nodes by incident count", "rank nodes by how many incidents they had, largest first",
                     "incidents per node, most first"):
        a = q(conn, question)
        assert a.status == "fact" and a.rows == expected, question


def test_a_column_named_with_its_entitys_noun_is_that_entitys_own(conn):
    a = q(conn, "which incident severity shows up the most?")   # not the severity of a drain's or loss's incident
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT severity, COUNT(*) AS n FROM incidents GROUP BY severity ORDER BY n DESC LIMIT 1")


def test_an_entitys_name_ending_in_its_measure_names_the_measure(conn):
    a = q(conn, "what was the highest training step job 1 reached?")   # "training step": KPI lines, and their step
    assert a.status == "fact" and a.rows == values(conn, "SELECT MAX(step) FROM kpis WHERE job_id = 1")


def test_an_average_in_the_present_tense_is_over_the_history(conn):
    a = q(conn, "what is the median time a node stays in validation?")   # not the nodes validating now
    assert a.status == "fact" and "lifecycle_transitions" in a.sql and "validating" in a.understood


@pytest.mark.parametrize("question,word", [
    ("how many message events on node2?", "message"),   # a word before the entity's noun that only names it
    ("what was the average median detection latency?", "median"),   # a slot said twice, two values
    ("how long was the first outage, last?", "last"),
    ("which incidents only led to a drain?", "only"),   # what else there was: a restriction not understood
    ("whose jobs were requeued?", "whose"),   # an owner the data does not record
])
def test_a_word_taken_without_effect_is_not_understood(conn, question, word):
    a = q(conn, question)
    assert a.status == "partial" and word in a.not_understood and not a.rows


def test_a_measure_no_row_in_scope_has_is_the_datas_gap_not_none(conn):
    a = q(conn, "what MFU is job 1 getting?")   # every KPI line's mfu is NULL
    assert a.status == "cannot" and "no values of mfu" in a.text and not a.rows
    assert q(conn, "what throughput did job 9 reach?").status == "fact"   # no KPI lines of job 9 at all: none


@pytest.mark.parametrize("question,sql", [
    ("how many log events came from node4 since 16:00?",
     "SELECT COUNT(*) FROM events WHERE source = 'log' AND node = 'node4' AND ts >= 1795791600"),
    ("which checkpoint request was never acked, and for which node?",
     "SELECT id, node FROM checkpoint_requests WHERE acked_at IS NULL"),
    ("when did the loss last go NaN?", "SELECT MAX(fault_ts) FROM incidents WHERE rule_id LIKE 'kpi-nan%'"),
    ("what step is job 1 on now?", "SELECT step FROM kpis WHERE job_id = 1 ORDER BY ts DESC LIMIT 1"),
    ("how much memory is free on node3 right now?",
     "SELECT value FROM samples WHERE node = 'node3' AND metric = 'host.mem.available_bytes' ORDER BY ts DESC LIMIT 1"),
    ("any nodes down right now?", "SELECT node FROM node_snapshots s WHERE ts = (SELECT MAX(ts) FROM node_snapshots "
                                  "WHERE node = s.node) AND state IN ('down', 'fail', 'failing')"),
    ("rules that have fired two or more times",
     "SELECT rule_id, COUNT(*) FROM incidents GROUP BY rule_id HAVING COUNT(*) >= 2"),
    ("break down the reboots by node",
     "SELECT target, COUNT(*) FROM actions WHERE kind = 'reboot' AND state = 'done' GROUP BY target"),
    ("how many actions are still pending?", "SELECT COUNT(*) FROM actions WHERE state = 'planned'"),
    ("how long ago was the last reboot?",
     "SELECT 1795794059.64476 - MAX(done_at) FROM actions WHERE kind = 'reboot' AND state = 'done'"),
    ("drains in the last hour vs the hour before that?",
     "SELECT (SELECT COUNT(*) FROM actions WHERE kind = 'drain' AND state = 'done' AND done_at >= 1795790459.64476), "
     "(SELECT COUNT(*) FROM actions WHERE kind = 'drain' AND state = 'done' AND done_at >= 1795786859.64476 "
     "AND done_at < 1795790459.64476)"),
    ("out of all checkpoint requests, how many were acked before their deadline?",
     "SELECT SUM(CASE WHEN acked_at < deadline THEN 1 ELSE 0 END), COUNT(*) FROM checkpoint_requests"),
    ("how many job losses were recovered from a periodic checkpoint?",
     "SELECT COUNT(*) FROM job_losses WHERE source = 'periodic'"),
    ("did any node run out of memory? which ones?", "SELECT DISTINCT node FROM events WHERE kind = 'oom_kill'"),
    ("how many incidents are open right now?", "SELECT COUNT(*) FROM incidents WHERE closed_at IS NULL"),
    ("compare the average detection latency of critical and warning incidents",
     "SELECT severity, AVG(opened_at - fault_ts) FROM incidents WHERE severity IN ('critical', 'warning') "
     "GROUP BY severity"),
    ("what was the longest a checkpoint request waited to be acknowledged?",
     "SELECT MAX(acked_at - requested_at) FROM checkpoint_requests"),
    ("how many incidents on node2 were not raised by the watchdog?",
     "SELECT COUNT(*) FROM incidents WHERE node = 'node2' AND source != 'watchdog'"),
    ("what mfu did node1 get per hour?", None),   # every KPI line's mfu is empty: the data's gap, per period too
    ("which drained nodes were never rebooted?",
     "SELECT target FROM actions WHERE kind = 'drain' AND state = 'done' EXCEPT "
     "SELECT target FROM actions WHERE kind = 'reboot' AND state = 'done'"),
    ("which nodes had checkpoint requests but never reboots?",
     "SELECT node FROM checkpoint_requests EXCEPT SELECT target FROM actions WHERE kind = 'reboot' AND state = 'done'"),
    ("how many checkpoints did job 1 write?",   # a checkpoint, and its ranks' writes: both numbers
     "SELECT COUNT(DISTINCT json_extract(fields, '$.step')), COUNT(*) FROM events WHERE source = 'kpi' AND "
     "kind = 'checkpoint' AND EXISTS (SELECT 1 FROM json_each(job_ids) j WHERE j.value = 1)"),
])
def test_words_of_held_out_14_read_by_general_mechanisms(conn, question, sql):
    a = q(conn, question)
    if sql is None:
        assert a.status == "cannot" and not a.rows
        return
    want = values(conn, sql)
    got = [tuple(round(v, 1) if isinstance(v, float) else v for v in r) for r in a.rows]
    want = [tuple(round(v, 1) if isinstance(v, float) else v for v in r) for r in want]
    assert a.status == "fact" and all(sorted(col) in [sorted(g) for g in zip(*got)] for col in zip(*want)) \
        and len(got) == len(want), (a.understood, a.rows, want)


STAYS = ("SELECT {agg}(v.ts - r.ts) FROM lifecycle_transitions r JOIN lifecycle_transitions v ON v.node = r.node "
         "AND v.cycle = r.cycle AND v.to_state = 'validating' WHERE r.to_state = 'remediating'")


def test_a_names_modifier_that_is_a_value_of_its_rows_is_that_value_unless_the_question_asks_it(conn):
    a = q(conn, "mean duration of the remediation stage")   # the time in remediation, never every stage's
    assert a.status == "fact" and values_of(a) == values(conn, STAYS.format(agg="AVG"))
    b = q(conn, "what remediation stage is node3 in?")   # the stage asked for: the name, no value given
    assert b.status == "fact" and b.rows[0][b.columns.index("stage")] == values(
        conn, "SELECT state FROM node_lifecycle WHERE node = 'node3'")[0][0]
    assert q(conn, "list the remediation stages of node1").status == "clarify"   # the stages of it, or those in it
    c = q(conn, "how long did the remediation stage last for node3 on average?")   # "last": the verb, not latest
    assert c.status == "fact" and values_of(c) == values(conn, STAYS.format(agg="AVG") + " AND r.node = 'node3'")


def test_a_row_without_its_own_start_time_is_not_a_reading_of_not(conn):
    a = q(conn, "how many incidents are not open?")   # every incident opened: "not open" is not opened_at unset
    assert a.status == "partial" and "not open" in a.text


def test_longest_and_shortest_rank_how_long_a_row_lasted(conn):
    a = q(conn, "shortest stay in remediation on node1")
    assert a.status == "fact" and values_of(a) == values(conn, STAYS.format(agg="MIN") + " AND r.node = 'node1'")
    b = q(conn, "which node had the longest single validation, and how long was it?")   # its duration, shown once
    assert b.status == "fact" and values_of(b) == values(
        conn, "SELECT v.node, r.ts - v.ts AS s FROM lifecycle_transitions v JOIN lifecycle_transitions r "
              "ON r.node = v.node AND r.cycle = v.cycle AND r.to_state = 'resumed' WHERE v.to_state = 'validating' "
              "ORDER BY s DESC LIMIT 1")
    assert q(conn, "which job has run the longest?").status == "partial"   # no duration: never a count of KPI lines


def test_a_value_spelled_as_another_entitys_noun_is_read_where_that_entity_does_not_fit(conn):
    a = q(conn, "how many requeues were shadowed instead of done?")   # done requeues are never shadowed: actions
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT COUNT(*) FROM actions WHERE kind = 'requeue' AND state = 'shadow'")
    b = q(conn, "how many requeues were there?")   # the noun's own entity fits: no other reading
    assert b.status == "fact" and b.rows == values(
        conn, "SELECT COUNT(*) FROM actions WHERE kind = 'requeue' AND state = 'done'")
    # drains are actions, not incidents: an incident's action 'drain' is what its rule decided, not a drain done
    assert q(conn, "which incidents were drained?").status != "fact"


def test_a_copula_a_writer_and_a_device_are_understood_beside_what_they_qualify(conn):
    a = q(conn, "how many health checks came back passed?")   # a result, not a return to service
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT COUNT(*) FROM events WHERE source = 'health' AND severity IN ('pass', 'accept')")
    assert q(conn, "which nodes came back failed?").status == "clarify"   # as "which nodes failed": not a drain's
    b = q(conn, "how many checkpoints has the trainer written?")   # each rank's trainer writes its own event
    assert b.status == "fact" and b.rows == values(
        conn, "SELECT COUNT(*) FROM events WHERE source = 'kpi' AND kind = 'checkpoint'")
    c = q(conn, "how many GPU Xid events were logged on node3?")
    assert c.status == "fact" and c.rows == values(
        conn, "SELECT COUNT(*) FROM events WHERE kind = 'xid' AND node = 'node3'")
    assert q(conn, "how many NVSwitch Xid errors?").status == "partial"   # Xid is the GPU's, not NVSwitch's


def test_a_unit_named_chooses_the_measure_in_it(conn):
    a = q(conn, "total seconds job 1 lost across its requeues")   # "lost": steps or time; seconds: the time
    truth = values(conn, "SELECT SUM(time_lost_s) FROM job_losses WHERE job_id = 1")
    assert a.status == "fact" and a.rows[0][0] == pytest.approx(truth[0][0])
    assert q(conn, "total seconds of steps lost by job 1").status != "fact"   # no measure of steps in seconds


def test_a_total_of_stays_within_a_time_range_is_the_part_inside_it(conn):
    now = reference_time(conn)
    a = q(conn, "per node, seconds out of service within the last hour")
    truth = values(conn, f"""WITH st AS (SELECT d.node, d.ts AS s, COALESCE((SELECT MIN(r.ts) FROM
        lifecycle_transitions r WHERE r.node = d.node AND r.cycle = d.cycle AND r.to_state = 'resumed'), {now!r}) AS e
        FROM lifecycle_transitions d WHERE d.to_state = 'drained' AND d.node IS NOT NULL)
        SELECT node, SUM(MAX(0, MIN(e, {now!r}) - MAX(s, {now!r} - 3600))) FROM st
        WHERE e > {now!r} - 3600 AND s < {now!r} GROUP BY node ORDER BY node""")
    assert a.status == "fact" and [(n, round(v, 3)) for n, v in a.rows] == [(n, round(v, 3)) for n, v in truth]


def test_a_negation_before_a_time_and_its_condition_negates_both(conn):
    a = q(conn, "how many checkpoint requests were not acked in time")   # never acked, or late
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT COUNT(*) FROM checkpoint_requests WHERE acked_at IS NULL OR acked_at > deadline")
    b = q(conn, "how many incidents remain unclosed")   # a negative prefix where only the rest means something
    assert b.status == "fact" and b.rows == values(conn, "SELECT COUNT(*) FROM incidents WHERE closed_at IS NULL")


def test_the_subject_of_a_superlative_is_named_and_different_values_are_counted(conn):
    a = q(conn, "node with the most remediation cycles")
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT node, cycle FROM node_lifecycle WHERE cycle = (SELECT MAX(cycle) FROM node_lifecycle)")
    b = q(conn, "how many ranks does job 1 run")   # a number naming a part of the row: its different values
    assert b.status == "fact" and b.rows == values(conn, "SELECT COUNT(DISTINCT rank) FROM kpis WHERE job_id = 1")
    assert "2 different ranks" in b.text
    c = q(conn, "node showing the most different kinds of errors?")
    assert c.status == "fact" and c.rows == values(conn, """SELECT node, n FROM (SELECT node, COUNT(DISTINCT kind) AS n
        FROM events WHERE severity = 'error' AND node IS NOT NULL GROUP BY node) WHERE n = (SELECT MAX(n) FROM (SELECT
        COUNT(DISTINCT kind) AS n FROM events WHERE severity = 'error' AND node IS NOT NULL GROUP BY node))
        ORDER BY node""")
    e = q(conn, "job with the highest loss")   # the job once, though two ranks' lines tie at the top
    assert e.status == "fact" and [r[0] for r in e.rows] == [r[0] for r in values(
        conn, "SELECT DISTINCT job_id FROM kpis WHERE loss = (SELECT MAX(loss) FROM kpis)")]
    assert q(conn, "how many unique nodes were drained").rows == values(
        conn, "SELECT COUNT(DISTINCT target) FROM actions WHERE kind = 'drain' AND state = 'done'")
    d = q(conn, "the checkpoint request nobody acknowledged — which node and job?")
    assert d.status == "fact" and [r[:2] for r in d.rows] == values(
        conn, "SELECT node, job_id FROM checkpoint_requests WHERE acked_at IS NULL")


def test_a_share_in_percent_and_a_word_suffixed_wise(conn):
    a = q(conn, "what share of incidents are critical, in percent")
    truth = values(conn, "SELECT 100.0 * SUM(severity = 'critical') / COUNT(*) FROM incidents")
    assert a.status == "fact" and a.rows[0][0] == pytest.approx(truth[0][0], abs=1e-3) and "%" in a.text
    b = q(conn, "where is job 1 at, step-wise, right now?")   # "step-wise": as to its step
    step = values(conn, "SELECT step FROM kpis WHERE job_id = 1 ORDER BY ts DESC LIMIT 1")[0][0]
    assert b.status == "fact" and step in b.rows[0]


def test_top_n_by_an_aggregate_of_a_measure_ranks_by_it(conn):
    assert q(conn, "top 3 rules by average time from open to close").rows == q(
        conn, "top 3 rules by average time open").rows   # "by" before the aggregate, whatever names the measure
    a = q(conn, "top 3 rules by average time open")
    assert a.status == "fact" and [r[0] for r in a.rows] == [r[0] for r in values(
        conn, "SELECT rule_id, AVG(closed_at - opened_at) AS v FROM incidents WHERE rule_id IS NOT NULL "
              "GROUP BY rule_id ORDER BY v DESC, rule_id LIMIT 3")]


def test_no_before_a_measure_is_zero_and_a_percentage_is_in_percent(conn):
    a = q(conn, "what percentage of job losses lost no steps at all")   # the share's numerator, in percent
    truth = values(conn, "SELECT 100.0 * SUM(steps_lost = 0) / COUNT(*) FROM job_losses")
    assert a.status == "fact" and a.rows[0][0] == pytest.approx(truth[0][0], abs=1e-3)
    assert q(conn, "how many incidents had no drains or no luck").status != "fact"


def test_now_of_readings_per_node_is_each_nodes_latest_reading(conn):
    a = q(conn, "which node is lowest on free memory now")
    assert a.status == "fact" and [r[0] for r in a.rows] == [r[0] for r in values(conn, """SELECT node FROM samples s
        WHERE metric = 'host.mem.available_bytes' AND ts = (SELECT MAX(ts) FROM samples WHERE node = s.node
        AND metric = 'host.mem.available_bytes') ORDER BY value LIMIT 1""")]


def test_a_window_is_on_the_time_the_verb_names(conn):
    now = reference_time(conn)
    a = q(conn, "how many incidents were closed in the last 45 minutes?")   # the closing, not the opening
    assert a.status == "fact" and a.rows == values(
        conn, f"SELECT COUNT(*) FROM incidents WHERE closed_at >= {now} - 2700")
    b = q(conn, "how many checkpoint requests were acknowledged in the past 30 minutes?")
    assert b.status == "fact" and b.rows == values(
        conn, f"SELECT COUNT(*) FROM checkpoint_requests WHERE acked_at >= {now} - 1800")
    c = q(conn, "how many incidents were opened in the last 45 minutes?")   # the row's own time
    assert c.status == "fact" and c.rows == values(
        conn, f"SELECT COUNT(*) FROM incidents WHERE opened_at >= {now} - 2700")


def test_a_total_is_of_what_the_question_names_and_otherwise_asked_back(conn):
    a = q(conn, "how long was the outage?")   # no node, job, rule or window: which of the stays is not said
    assert a.status == "clarify" and "total" in a.text
    b = q(conn, "how long was node3 out of service?")   # the node's time out: its stays added up, said as such
    assert b.status == "fact" and "total" in b.text


def test_everyday_time_words_and_stated_bucket_sizes(conn):
    now = reference_time(conn)
    midnight = datetime.fromtimestamp(now, BERLIN).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    a = q(conn, "how many reboots since midnight?")
    assert a.status == "fact" and a.rows == values(
        conn, f"SELECT COUNT(*) FROM actions WHERE kind = 'reboot' AND state = 'done' AND done_at >= {midnight}")
    b = q(conn, "how many incidents were opened in the past half hour?")
    assert b.status == "fact" and b.rows == values(
        conn, f"SELECT COUNT(*) FROM incidents WHERE opened_at >= {now} - 1800")
    d = q(conn, "how many checkpoint requests are without an ack?")   # "without" a time: that time is not there
    assert d.status == "fact" and d.rows == values(
        conn, "SELECT COUNT(*) FROM checkpoint_requests WHERE acked_at IS NULL")
    e = q(conn, "incidents per node, busiest first")
    assert e.status == "fact" and [r[1] for r in e.rows] == sorted((r[1] for r in e.rows), reverse=True)
    f = q(conn, "incidents opened in 20-minute buckets")
    assert f.status == "fact" and all(r[0] % 1200 == 0 for r in f.rows)
    g = q(conn, "what state is node3 in atm?")   # "atm": now, the current-state view
    assert g.status == "fact" and g.rows[0][1] == values(
        conn, "SELECT state FROM node_snapshots WHERE node = 'node3' ORDER BY ts DESC LIMIT 1")[0][0]


def test_a_percentile_is_the_nearest_rank(conn):
    a = q(conn, "what is the p75 detection latency?")
    lat = sorted(r[0] for r in conn.execute("SELECT opened_at - fault_ts FROM incidents WHERE fault_ts IS NOT NULL"))
    assert a.status == "fact" and round(a.rows[0][0], 3) == round(lat[-(-75 * len(lat) // 100) - 1], 3)
    assert q(conn, "p90 of incidents").status == "partial"   # a percentile of no measure


def test_a_measures_value_word_and_now_of_the_measure_asked(conn):
    latest = values(conn, "SELECT loss FROM kpis WHERE job_id = 1 ORDER BY ts DESC LIMIT 1")[0][0]
    a = q(conn, "what is the latest loss value of job 1?")   # "value": the measure just named
    assert a.status == "fact" and latest in [round(v, 3) for v in a.rows[0] if isinstance(v, float)]
    step = values(conn, "SELECT step FROM kpis WHERE job_id = 1 ORDER BY ts DESC LIMIT 1")[0][0]
    b = q(conn, "what training step is job 1 at right now?")
    assert b.status == "fact" and step in b.rows[0]


def test_time_from_the_row_to_a_time_a_duration_names(conn):
    a = q(conn, "median time from request to ack?")   # the row's own time, then the duration its end names
    assert a.status == "fact" and q(conn, "median ack time?").rows == a.rows


def test_slowest_and_fastest_rank_the_one_duration_the_rows_have(conn):
    a = q(conn, "what was the slowest checkpoint save?")   # checkpoints have one duration: their save time
    saves = "SELECT MAX(json_extract(fields, '$.save_s')) FROM events WHERE source = 'kpi' AND kind = 'checkpoint'"
    assert a.status == "fact" and a.rows[0][0] == values(conn, saves)[0][0]
    b = q(conn, "which was the quickest checkpoint save?")
    assert b.status == "fact" and b.text.startswith("The least")


def test_a_reading_after_an_order_is_the_row_and_an_abbreviation_its_word(conn):
    a = q(conn, "node1 free mem at last reading, bytes")   # "mem": memory; "last reading": the latest row
    truth = values(conn, "SELECT value FROM samples WHERE node = 'node1' AND metric = 'host.mem.available_bytes' "
                         "ORDER BY ts DESC LIMIT 1")
    assert a.status == "fact" and truth[0][0] in a.rows[0]
    assert q(conn, "any reading of incidents").status == "partial"   # incidents are no history of readings


def test_a_hyphenated_word_of_a_phrase_stays_one_word(conn):
    a = q(conn, "of job 1's requeues, how many resumed from a just-in-time checkpoint?")
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT COUNT(*) FROM job_losses WHERE job_id = 1 AND source = 'jit'")


def test_every_node_of_a_current_state_lists_each_node(conn):
    a = q(conn, "what is the current slurm state of every node?")   # each node's row, never the single latest
    assert a.status == "fact" and len(a.rows) == values(conn, "SELECT COUNT(DISTINCT node) FROM node_snapshots")[0][0]


def test_which_plural_column_noun_lists_its_different_values(conn):
    a = q(conn, "what severities did incidents on node2 have?")
    truth = values(conn, "SELECT DISTINCT severity FROM incidents WHERE node = 'node2' AND severity <> ''")
    assert a.status == "fact" and sorted(r[0] for r in a.rows) == sorted(r[0] for r in truth)


def test_a_count_of_a_fault_a_node_reported_counts_its_reports(conn):
    a = q(conn, "how many nan losses did node2 report?")   # its events, not the incidents opened for them
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT COUNT(*) FROM events WHERE kind = 'nan_loss' AND node = 'node2'")
    b = q(conn, "how many nan losses did the controller catch?")   # the controller's own: incidents
    assert b.status == "fact" and b.rows == values(conn, "SELECT COUNT(*) FROM incidents WHERE rule_id LIKE 'kpi-nan%'")


def test_a_word_read_two_ways_gives_both_figures(conn):
    a = q(conn, "how many errors did node1 log?")   # any source and error, or kernel log and error or critical
    both = values(conn, "SELECT (SELECT COUNT(*) FROM events WHERE node = 'node1' AND severity = 'error'), "
                        "(SELECT COUNT(*) FROM events WHERE node = 'node1' AND source = 'log' AND severity IN "
                        "('error', 'critical'))")
    assert both[0][0] != both[0][1] and a.status == "fact" and a.rows == both and "Read two ways" in a.text
    b = q(conn, "how many errors did node4 log?")   # the two readings agree: one figure
    assert b.status == "fact" and len(b.rows[0]) == 1 and "Read two ways" not in b.text
    c = q(conn, "which kinds of log error showed up on node1?")   # "log" before a noun: the kernel log alone
    truth = values(conn, "SELECT DISTINCT kind FROM events WHERE node = 'node1' AND source = 'log' AND severity IN "
                         "('error', 'critical')")
    assert c.status == "fact" and sorted(r[0] for r in c.rows) == sorted(r[0] for r in truth)

    d = q(conn, "per node, number of failed health checks")   # suites' rejects beside the checks' own fails, or not
    truth = values(conn, "SELECT node, SUM(severity IN ('fail', 'reject')), SUM(severity = 'fail') FROM events "
                         "WHERE source = 'health' AND severity IN ('fail', 'reject') GROUP BY node ORDER BY node")
    assert d.status == "fact" and d.rows == truth and "fail or reject" in d.text and "Read two ways" in d.text


def test_a_faults_words_that_are_the_only_noun_judge_the_thing_and_are_asked_back(conn):
    a = q(conn, "show me the slow nodes")   # slowdown incidents, or step time, load or utilisation per node
    assert a.status == "clarify" and not a.rows and "step time" in a.text
    b = q(conn, "how many slow node incidents")   # another noun names what is counted: the fault's incidents
    assert b.status == "fact" and b.rows == values(
        conn, "SELECT COUNT(*) FROM incidents WHERE rule_id IN ('isolation-outlier', 'watchdog-throughput-drop')")


def test_a_things_whole_run_is_no_time_bound(conn):
    a = q(conn, "job 1's mean step time over its whole run")
    truth = values(conn, "SELECT AVG(step_time_s) FROM kpis WHERE job_id = 1")
    assert a.status == "fact" and a.rows[0][0] == pytest.approx(truth[0][0], rel=1e-3)   # as said


def test_two_tests_of_one_column_that_are_not_its_values_both_hold(conn):
    a = q(conn, "how many acknowledged requests missed their deadline")   # acked, and late: never "or"
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT COUNT(*) FROM checkpoint_requests WHERE acked_at IS NOT NULL AND acked_at > deadline")
    b = q(conn, "how many acks arrived past their deadline")   # arriving before a time: the row's own, no condition
    assert b.status == "fact" and b.rows == values(
        conn, "SELECT COUNT(*) FROM checkpoint_requests WHERE acked_at > deadline")

def test_a_time_set_only_in_one_state_beside_another_state_is_not_understood(conn):
    assert q(conn, "how many drains were completed in shadow mode?").status == "partial"   # never done: not 0
    assert q(conn, "how many reboots finished in shadow mode").status == "partial"
    a = q(conn, "how many drains happened in shadow mode?")   # no time word: the shadow ones
    assert a.status == "fact" and a.rows == values(
        conn, "SELECT COUNT(*) FROM actions WHERE kind = 'drain' AND state = 'shadow'")


def test_both_x_and_y_is_an_intersection_not_understood_never_the_union(conn):
    assert q(conn, "which rules fired on both node1 and node4").status == "partial"
    a = q(conn, "which rules fired on node1 or node4")   # either: the union, as asked
    truth = values(conn, "SELECT DISTINCT rule_id FROM incidents WHERE node IN ('node1', 'node4')")
    assert a.status == "fact" and sorted(r[0] for r in a.rows) == sorted(r[0] for r in truth)


def test_a_dimension_word_before_the_entity_noun_is_its_category_value(conn):
    a = q(conn, "average detection latency of job incidents")   # scope job, one figure, not one per job
    truth = values(conn, "SELECT AVG(opened_at - fault_ts) FROM incidents WHERE scope = 'job'")
    assert a.status == "fact" and len(a.rows) == 1 and a.rows[0][0] == pytest.approx(truth[0][0])


def test_what_column_is_every_node_in_lists_each_nodes_value(conn):
    truth = values(conn, "SELECT node, state FROM node_lifecycle")
    for question in ("which lifecycle state is each node in?", "what remediation state is every node in?"):
        a = q(conn, question)   # each node's own row, never a count per node
        assert a.status == "fact" and sorted((r[0], r[1]) for r in a.rows) == sorted(truth)


def test_a_fault_reported_asked_when_is_its_reports_time(conn):
    a = q(conn, "when was the latest xid reported on node2")   # the xid line itself, not the incident opened
    truth = values(conn, "SELECT MAX(ts) FROM events WHERE kind = 'xid' AND node = 'node2'")
    assert a.status == "fact" and a.rows[0][0] == pytest.approx(truth[0][0], abs=0.01)
    b = q(conn, "when was the latest xid incident on node2")   # the incidents named: their opening
    truth = values(conn, "SELECT MAX(opened_at) FROM incidents WHERE rule_id LIKE 'gpu-xid%' AND node = 'node2'")
    assert b.status == "fact" and b.rows[0][0] == pytest.approx(truth[0][0], abs=0.01) != a.rows[0][0]


def test_shorthands_are_written_out(conn):
    a = q(conn, "how many ckpts were requested w/o an ack?")   # checkpoints, without
    truth = values(conn, "SELECT COUNT(*) FROM checkpoint_requests WHERE acked_at IS NULL")
    assert a.status == "fact" and a.rows == truth
    b = q(conn, "how many drains in the last 90m")   # minutes
    assert b.status == "fact" and b.rows == q(conn, "how many drains in the last 90 minutes").rows


def test_the_n_rows_that_rank_highest_are_listed(conn):
    a = q(conn, "the 2 incidents that stayed open the longest")   # two rows, never the single extreme value
    truth = conn.execute("SELECT id FROM incidents WHERE closed_at IS NOT NULL ORDER BY closed_at - opened_at DESC "
                         "LIMIT 2").fetchall()   # in order, longest first
    assert a.status == "fact" and [r[0] for r in a.rows] == [r[0] for r in truth]
