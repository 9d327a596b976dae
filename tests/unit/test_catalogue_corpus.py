"""The corpus of real log lines (tests/fixtures/catalogue): well formed, split by source, and every line of its
tuning part handled as a careful admin wants, class by class, through the sidecar's log sections and the rules
(bench/catalogue.py measures every part; the held-out parts are measured there, never asserted here)."""

from __future__ import annotations

import hashlib

import pytest

from tests.conftest import load_bench

catalogue = load_bench("catalogue")
ROWS = catalogue.load_corpus(catalogue.CORPUS)
WANTS = {"drain", "drain+reboot", "drain+ticket", "requeue", "notify", "record", "none"}
CLASSES = {"gpu", "nvlink", "memory", "pcie", "network", "storage", "filesystem", "kernel", "oom", "job-nccl",
           "job-cuda"}


def test_every_row_names_its_public_source_and_a_known_action():
    assert len(ROWS) >= 300
    for row in ROWS:
        assert row["src"].startswith(("https://", "http://")), row  # the address as published
        assert row["want"] in WANTS and row["cls"] in CLASSES and row["line"].strip(), row
    assert {r["cls"] for r in ROWS} == CLASSES


def test_the_held_out_part_is_about_a_third_of_the_sources_by_their_address():
    sources = {r["src"] for r in ROWS if r["part"] in ("tuning", "held-out")}
    held = {s for s in sources if hashlib.sha256(s.encode()).digest()[0] % 10 < 3}
    assert {r["src"] for r in ROWS if r["part"] == "held-out"} == held
    assert 0.2 < len(held) / len(sources) < 0.4


def test_the_second_held_out_part_has_its_own_sources_and_a_third_benign():
    second = [r for r in ROWS if r["part"] == "held-out-2"]
    assert len(second) >= 80
    assert not {r["src"] for r in second} & {r["src"] for r in ROWS if r["part"] != "held-out-2"}
    assert sum(r["want"] in ("notify", "record", "none") for r in second) >= len(second) / 3


def test_the_third_held_out_part_has_its_own_sources_and_every_class():
    third = [r for r in ROWS if r["part"] == "held-out-3"]
    assert len(third) >= 80
    assert not {r["src"] for r in third} & {r["src"] for r in ROWS if r["part"] != "held-out-3"}
    assert {r["cls"] for r in third} == CLASSES


def test_the_fourth_held_out_part_has_its_own_sources_and_benign_look_alikes():
    fourth = [r for r in ROWS if r["part"] == "held-out-4"]
    assert len(fourth) >= 60 and len({r["src"] for r in fourth}) >= 25
    assert not {r["src"] for r in fourth} & {r["src"] for r in ROWS if r["part"] != "held-out-4"}
    assert sum(r["want"] in ("notify", "record", "none") for r in fourth) >= len(fourth) / 3
    assert len({r["fmt"] for r in fourth}) >= 5


def test_the_fifth_held_out_part_has_its_own_sources_every_class_and_benign_look_alikes():
    fifth = [r for r in ROWS if r["part"] == "held-out-5"]
    assert len(fifth) >= 60 and len({r["src"] for r in fifth}) >= 25
    assert not {r["src"] for r in fifth} & {r["src"] for r in ROWS if r["part"] != "held-out-5"}
    assert {r["cls"] for r in fifth} == CLASSES and len({r["fmt"] for r in fifth}) >= 5
    assert sum(r["want"] in ("notify", "record", "none") for r in fifth) >= len(fifth) / 3


def test_the_sixth_held_out_part_has_its_own_sources_every_class_and_benign_look_alikes():
    sixth = [r for r in ROWS if r["part"] == "held-out-6"]
    assert len(sixth) >= 70 and len({r["src"] for r in sixth}) >= 30
    assert not {r["src"] for r in sixth} & {r["src"] for r in ROWS if r["part"] != "held-out-6"}
    assert {r["cls"] for r in sixth} == CLASSES and len({r["fmt"] for r in sixth}) >= 5
    assert sum(r["want"] in ("notify", "record", "none") for r in sixth) >= len(sixth) / 3


def test_the_seventh_held_out_part_has_its_own_sources_and_benign_look_alikes():
    seventh = [r for r in ROWS if r["part"] == "held-out-7"]
    assert len(seventh) >= 80 and len({r["src"] for r in seventh}) >= 40
    assert not {r["src"] for r in seventh} & {r["src"] for r in ROWS if r["part"] != "held-out-7"}
    assert len({r["fmt"] for r in seventh}) >= 5
    assert sum(r["want"] in ("notify", "record", "none") for r in seventh) >= len(seventh) / 3


def test_the_eighth_held_out_part_has_its_own_sources_and_benign_look_alikes():
    eighth = [r for r in ROWS if r["part"] == "held-out-8"]
    assert len(eighth) >= 90 and len({r["src"] for r in eighth}) >= 45
    assert not {r["src"] for r in eighth} & {r["src"] for r in ROWS if r["part"] != "held-out-8"}
    assert len({r["fmt"] for r in eighth}) >= 5
    assert sum(r["want"] in ("notify", "record", "none") for r in eighth) >= len(eighth) / 3


@pytest.mark.parametrize("part", ["held-out-9", "held-out-10"])
def test_a_sampled_held_out_part_is_a_sample_of_its_own_sources(part):
    """Sampled by fixed generic searches, not aimed at gaps: mostly lines that want no action, as a day's are."""
    sample = [r for r in ROWS if r["part"] == part]
    assert len(sample) >= 100 and len({r["src"] for r in sample}) >= 30
    assert not {r["src"] for r in sample} & {r["src"] for r in ROWS if r["part"] != part}
    assert max(sum(r["src"] == s for r in sample) for s in {r["src"] for r in sample}) <= 6  # a source's first excerpt
    assert sum(r["want"] in ("notify", "record", "none") for r in sample) >= len(sample) / 2


def test_the_logbook_part_is_every_quoted_line_of_training_run_logbooks():
    """Every log line the logbooks quote, in order: mostly a healthy run's own output."""
    logbook = [r for r in ROWS if r["part"] == "held-out-11"]
    assert len(logbook) >= 100
    assert not {r["src"] for r in logbook} & {r["src"] for r in ROWS if r["part"] != "held-out-11"}
    assert all("/chronicles" in r["src"] and "/blob/" in r["src"] for r in logbook)  # a logbook file at a commit
    assert len({r["line"] for r in logbook}) == len(logbook)
    assert sum(r["want"] in ("notify", "record", "none") for r in logbook) >= len(logbook) / 2


def test_an_unknown_part_is_refused_naming_the_source(tmp_path):
    bad = tmp_path / "corpus.yaml"
    bad.write_text("sources:\n- src: https://example.org/x\n  part: held-in\n  lines:\n"
                   "  - [none, kernel, message, x]\n")
    with pytest.raises(ValueError, match="https://example.org/x.*held-in"):
        catalogue.load_corpus(bad)


@pytest.fixture(scope="module")
def tuning():
    from sigma.paths import configs_dir

    rows = [r for r in ROWS if r["part"] == "tuning"]
    return rows, catalogue.evaluate(rows, configs_dir() / "rules", configs_dir() / "telemetry.yaml")


@pytest.mark.parametrize("cls", sorted(CLASSES))
def test_each_class_of_the_tuning_part_gets_the_action_it_calls_for(tuning, cls):
    rows, results = tuning
    checked = 0
    for row, res in zip(rows, results):
        if row["cls"] != cls:
            continue
        checked += 1
        for figure, value in catalogue.score(row, res).items():
            failed = value if figure in catalogue.FAILED_WHEN_TRUE else not value
            assert not failed, f"{figure}: want {row['want']}, got {res['rules'] or 'nothing'}: {row['line']!r}"
    assert checked
