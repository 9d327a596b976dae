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


def part_rows(part: str) -> list[dict]:
    """The part's lines, once none of its sources was found cited by another part."""
    rows = [r for r in ROWS if r["part"] == part]
    assert not {r["src"] for r in rows} & {r["src"] for r in ROWS if r["part"] != part}
    return rows


def test_the_second_held_out_part_has_its_own_sources_and_a_third_benign():
    second = part_rows("held-out-2")
    assert len(second) >= 80
    assert sum(r["want"] in ("notify", "record", "none") for r in second) >= len(second) / 3


def test_the_third_held_out_part_has_its_own_sources_and_every_class():
    third = part_rows("held-out-3")
    assert len(third) >= 80
    assert {r["cls"] for r in third} == CLASSES


AIMED = {  # a part gathered towards classes: at least (lines, sources), and whether it holds every class
    "held-out-4": (60, 25, False), "held-out-5": (60, 25, True), "held-out-6": (70, 30, True),
    "held-out-7": (80, 40, False), "held-out-8": (90, 45, False)}


@pytest.mark.parametrize("part", sorted(AIMED))
def test_an_aimed_held_out_part_has_its_own_sources_and_benign_look_alikes(part):
    lines, sources, every_class = AIMED[part]
    rows = part_rows(part)
    assert len(rows) >= lines and len({r["src"] for r in rows}) >= sources
    assert len({r["fmt"] for r in rows}) >= 5 and (not every_class or {r["cls"] for r in rows} == CLASSES)
    assert sum(r["want"] in ("notify", "record", "none") for r in rows) >= len(rows) / 3


@pytest.mark.parametrize("part", ["held-out-9", "held-out-10"])
def test_a_sampled_held_out_part_is_a_sample_of_its_own_sources(part):
    """Sampled by fixed generic searches, not aimed at gaps: mostly lines that want no action, as a day's are."""
    sample = part_rows(part)
    assert len(sample) >= 100 and len({r["src"] for r in sample}) >= 30
    assert max(sum(r["src"] == s for r in sample) for s in {r["src"] for r in sample}) <= 6  # a source's first excerpt
    assert sum(r["want"] in ("notify", "record", "none") for r in sample) >= len(sample) / 2


def test_the_logbook_part_is_every_quoted_line_of_training_run_logbooks():
    """Every log line the logbooks quote, in order: mostly a healthy run's own output."""
    logbook = part_rows("held-out-11")
    assert len(logbook) >= 100
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
