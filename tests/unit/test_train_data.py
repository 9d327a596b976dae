"""Token shards, the byte tokenizer and the deterministic resumable sampler."""

import json

import numpy as np
import pytest

from sigma.train.data import ByteTokenizer, TokenShards, WindowSampler, corpus_files, prepare, stdlib_dir


def test_prepare_writes_shards_and_meta_from_the_stdlib(train_data):
    meta = json.loads((train_data / "meta.json").read_text())
    assert meta["tokenizer"] == "byte" and meta["vocab_size"] == 257
    assert len(meta["shards"]) >= 2, "0.5 MB in 100k-token shards must span several shards"
    shards = TokenShards(train_data)
    assert shards.num_tokens == meta["tokens"] == sum(s["tokens"] for s in meta["shards"])
    first = corpus_files(stdlib_dir())[0].read_bytes()
    assert ByteTokenizer().decode(shards.read(0, 40)) == first[:40].decode()
    assert int(shards.read(len(first), 1)[0]) == ByteTokenizer.eos_id  # document separator


def test_read_across_a_shard_border_matches_the_concatenated_stream(train_data):
    shards = TokenShards(train_data)
    stream = np.concatenate([np.asarray(m) for m in shards.maps])
    border = int(shards.offsets[1])
    assert np.array_equal(shards.read(border - 7, 20), stream[border - 7:border + 13])
    with pytest.raises(IndexError):
        shards.read(shards.num_tokens - 5, 10)


def test_unprepared_directory_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="sigma train prepare"):
        TokenShards(tmp_path)


def test_prepare_of_an_empty_source_fails(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(ValueError, match="no Python sources"):
        prepare(tmp_path / "out", tmp_path / "src")
    assert not (tmp_path / "out" / "meta.json").exists()


def test_sampler_is_deterministic_and_seed_dependent(train_data):
    shards = TokenShards(train_data)
    a = WindowSampler(shards, 32, 4, seed=1)
    b = WindowSampler(shards, 32, 4, seed=1)
    c = WindowSampler(shards, 32, 4, seed=2)
    batches_a = [a.next() for _ in range(5)]
    assert all(np.array_equal(x, b.next()) for x in batches_a)
    assert not np.array_equal(batches_a[0], c.next())
    assert batches_a[0].shape == (4, 33)
    # consecutive tokens: targets are inputs shifted by one
    assert np.array_equal(batches_a[0][0], shards.read(int(a._window(0)) * 32, 33))


def test_sampler_resumes_exactly_from_its_state(train_data):
    shards = TokenShards(train_data)
    straight = WindowSampler(shards, 16, 2, seed=3)
    expected = [straight.next() for _ in range(12)]
    first = WindowSampler(shards, 16, 2, seed=3)
    for _ in range(7):
        first.next()
    resumed = WindowSampler(shards, 16, 2, seed=3)
    resumed.load_state_dict(first.state_dict())
    assert all(np.array_equal(expected[7 + i], resumed.next()) for i in range(5))
    with pytest.raises(ValueError, match="seed"):
        WindowSampler(shards, 16, 2, seed=4).load_state_dict(first.state_dict())


def test_data_parallel_slices_make_up_the_same_global_batch(train_data):
    shards = TokenShards(train_data)
    whole = WindowSampler(shards, 16, 4, seed=0).batch(3)
    parts = [WindowSampler(shards, 16, 4, seed=0, dp_rank=r, dp_size=2).batch(3) for r in range(2)]
    assert np.array_equal(whole, np.concatenate(parts))
    with pytest.raises(ValueError, match="not divisible"):
        WindowSampler(shards, 16, 4, dp_size=3)


def test_epochs_visit_every_window_once(train_data):
    shards = TokenShards(train_data)
    sampler = WindowSampler(shards, 4096, 2, seed=0)
    n = sampler.num_windows
    seen = [sampler._window(i) for i in range(n)]
    assert sorted(seen) == list(range(n))
    assert [sampler._window(n + i) for i in range(n)] != seen  # the next epoch has its own order
