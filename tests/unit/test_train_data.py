"""Token shards, the BPE and byte tokenizers, the held-out split and the deterministic resumable sampler."""

import json

import numpy as np
import pytest

from sigma.train.data import (ByteTokenizer, TokenShards, WindowSampler, corpus_files, is_eval_document,
                              load_tokenizer, prepare, stdlib_dir)


def first_document(ids, eos_id):
    ends = np.flatnonzero(ids == eos_id)
    return ids[:int(ends[0])] if ends.size else ids


def test_prepare_writes_shards_and_meta_from_the_stdlib(train_data):
    meta = json.loads((train_data / "meta.json").read_text())
    assert meta["tokenizer"] == "bpe" and meta["vocab_size"] == 512 and meta["tokenizer_file"] == "tokenizer.json"
    assert len(meta["shards"]) >= 2, "0.5 MB in 100k-token shards must span several shards"
    shards = TokenShards(train_data)
    assert shards.num_tokens == meta["tokens"] == sum(s["tokens"] for s in meta["shards"])
    tok = load_tokenizer(train_data)
    assert tok.vocab_size == 512 and int(shards.maps[0].max()) < 512
    files = corpus_files(stdlib_dir())
    first = files[0].read_bytes()  # document 0 is a training document
    assert first.decode().startswith(tok.decode(first_document(shards.read(0, 200), tok.eos_id)))
    # subwords, not bytes: the same text takes far fewer tokens than bytes
    assert meta["train_tokens"] < 0.75 * sum(len(f.read_bytes()) for f in files[:meta["documents"]])


def test_held_out_documents_are_a_separate_split(train_data):
    meta = json.loads((train_data / "meta.json").read_text())
    assert meta["eval_documents"] >= 1 and meta["eval_shards"]
    held_out = TokenShards(train_data, split="eval")
    assert held_out.num_tokens == meta["eval_tokens"] > 0
    tok = load_tokenizer(train_data)
    files = corpus_files(stdlib_dir())
    held = [i for i in range(meta["documents"]) if is_eval_document(i, meta["eval_fraction"])]
    k = held[0] if held else meta["documents"] - 1  # few documents: the last one is held out
    ids = held_out.read(0, 100)
    assert files[k].read_bytes().decode().startswith(tok.decode(first_document(ids, tok.eos_id)))
    train = TokenShards(train_data)
    assert not np.array_equal(train.read(0, 100), ids)


def test_byte_tokenizer_and_bad_vocabulary(tmp_path):
    meta = prepare(tmp_path / "byte", max_mb=0.05, tokenizer="byte")
    assert meta["vocab_size"] == 257 and "tokenizer_file" not in meta
    assert ByteTokenizer().decode(TokenShards(tmp_path / "byte").read(0, 30)) == \
        corpus_files(stdlib_dir())[0].read_bytes()[:30].decode()
    with pytest.raises(ValueError, match="vocab_size must be in 257"):
        prepare(tmp_path / "bad", max_mb=0.05, vocab_size=100)
    with pytest.raises(ValueError, match="no held-out split"):
        TokenShards(prepare(tmp_path / "none", max_mb=0.05, tokenizer="byte", eval_fraction=0) and tmp_path / "none",
                    split="eval")


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
