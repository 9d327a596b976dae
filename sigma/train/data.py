"""Training data: a subword tokenizer trained locally, memory-mapped token shards with a held-out split, and a
deterministic resumable sampler.

The demo corpus is the Python standard library's own sources, which exist wherever Python does, so every
machine (CI, laptops, compute nodes without internet) trains on the same real text without downloads.

Layout of a prepared directory (`sigma train prepare --out DIR`):
    DIR/tokenizer.json        the byte-level BPE tokenizer trained on the training documents (`tokenizers`)
    DIR/shard-00000.bin ...   training tokens: uint16 ids, one flat stream per shard, documents separated by EOS
    DIR/eval-00000.bin ...    held-out tokens: every k-th document, never seen by the tokenizer trainer or training
    DIR/meta.json             tokenizer, vocab size, shard names and token counts; written last, so a
                              directory without it is an unfinished prepare and is refused
"""

from __future__ import annotations

import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

META_NAME = "meta.json"
TOKENIZER_NAME = "tokenizer.json"
TOKEN_DTYPE = np.uint16
EOS_TOKEN = "<|endoftext|>"
SPLITS = ("train", "eval")


class ByteTokenizer:
    """Bytes 0..255 are their own ids; id 256 marks the end of a document. No files, no training."""

    name = "byte"
    eos_id = 256
    vocab_size = 257

    def encode_documents(self, docs: list[bytes]) -> list[np.ndarray]:
        out = []
        for data in docs:
            ids = np.empty(len(data) + 1, dtype=TOKEN_DTYPE)
            ids[:-1] = np.frombuffer(data, dtype=np.uint8)
            ids[-1] = self.eos_id
            out.append(ids)
        return out

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def save(self, directory: Path) -> dict:
        return {}


class BpeTokenizer:
    """Byte-level BPE (GPT-2 style) from the `tokenizers` library, trained on the corpus itself.

    Byte-level: every byte has a token, so any text encodes; invalid UTF-8 in a source file is replaced by U+FFFD
    before training and encoding (the tokenizer works on text)."""

    name = "bpe"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.token_to_id(EOS_TOKEN)
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def train(cls, docs: list[bytes], vocab_size: int) -> "BpeTokenizer":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if not 257 <= vocab_size <= np.iinfo(TOKEN_DTYPE).max + 1:
            raise ValueError(f"BPE vocab_size must be in 257..{np.iinfo(TOKEN_DTYPE).max + 1} (256 bytes + "
                             f"end-of-document, uint16 shards), got {vocab_size}")
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator((_text(d) for d in docs), trainer, length=len(docs))
        return cls(tokenizer)

    @classmethod
    def load(cls, directory: Path) -> "BpeTokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(Path(directory) / TOKENIZER_NAME)))

    def encode_documents(self, docs: list[bytes]) -> list[np.ndarray]:
        encoded = self.tokenizer.encode_batch([_text(d) for d in docs])
        return [np.asarray(e.ids + [self.eos_id], dtype=TOKEN_DTYPE) for e in encoded]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids if int(i) != self.eos_id])

    def save(self, directory: Path) -> dict:
        tmp = directory / f".{TOKENIZER_NAME}.tmp-{os.getpid()}"
        self.tokenizer.save(str(tmp))
        os.replace(tmp, directory / TOKENIZER_NAME)
        return {"tokenizer_file": TOKENIZER_NAME}


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


TOKENIZERS = ("bpe", "byte")


def load_tokenizer(directory: str | Path):
    """The tokenizer a prepared directory was made with."""
    directory = Path(directory).expanduser()
    meta = json.loads((directory / META_NAME).read_text())
    return BpeTokenizer.load(directory) if meta["tokenizer"] == "bpe" else ByteTokenizer()


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(source: Path) -> list[Path]:
    """Python sources under source in a stable order; installed third-party packages are not the stdlib."""
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = [p for p in source.rglob("*.py") if p.is_file() and not skip.intersection(p.relative_to(source).parts)]
    return sorted(files, key=lambda p: p.relative_to(source).as_posix())


def is_eval_document(index: int, eval_fraction: float) -> bool:
    """Every k-th document (k = 1 / eval_fraction) is held out: spread over the whole corpus, not its tail."""
    if eval_fraction <= 0:
        return False
    every = max(2, round(1 / eval_fraction))
    return index % every == every - 1


def prepare(out: str | Path, source: str | Path | None = None, max_mb: float = 16.0,
            shard_tokens: int = 4_000_000, tokenizer: str = "bpe", vocab_size: int = 8192,
            eval_fraction: float = 0.05) -> dict:
    """Read the corpus under source (default: the stdlib), train the tokenizer on its training documents and
    write the train and held-out shards under out; return the metadata."""
    out = Path(out).expanduser()
    source = Path(source).expanduser() if source else stdlib_dir()
    if not source.is_dir():
        raise FileNotFoundError(f"corpus directory {source} does not exist")
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; valid: {', '.join(TOKENIZERS)}")
    if shard_tokens < 1024:
        raise ValueError(f"shard_tokens must be at least 1024, got {shard_tokens}")
    if not 0 <= eval_fraction < 0.5:
        raise ValueError(f"eval_fraction must be in [0, 0.5), got {eval_fraction}")
    budget = int(max_mb * 1e6)
    docs: dict[str, list[bytes]] = {split: [] for split in SPLITS}
    used_bytes = 0
    for index, path in enumerate(corpus_files(source)):
        if used_bytes >= budget:
            break
        data = path.read_bytes()[: budget - used_bytes]
        used_bytes += len(data)
        docs["eval" if is_eval_document(index, eval_fraction) else "train"].append(data)
    if not docs["train"]:
        raise ValueError(f"no Python sources found under {source}")
    if eval_fraction > 0 and not docs["eval"] and len(docs["train"]) > 1:
        docs["eval"].append(docs["train"].pop())  # a corpus of fewer than k documents still gets a held-out one
    out.mkdir(parents=True, exist_ok=True)
    (out / META_NAME).unlink(missing_ok=True)  # the directory is incomplete until the new meta lands
    tok = BpeTokenizer.train(docs["train"], vocab_size) if tokenizer == "bpe" else ByteTokenizer()
    meta = {"format": 2, "tokenizer": tok.name, **tok.save(out), "vocab_size": tok.vocab_size,
            "eos_id": tok.eos_id, "dtype": np.dtype(TOKEN_DTYPE).name, "source": str(source),
            "eval_fraction": eval_fraction}
    for split, prefix in (("train", "shard"), ("eval", "eval")):
        shards = _write_shards(out, prefix, tok.encode_documents(docs[split]), shard_tokens)
        key = "shards" if split == "train" else "eval_shards"
        meta.update({key: shards, f"{split}_documents": len(docs[split]),
                     f"{split}_tokens": sum(s["tokens"] for s in shards)})
    meta["documents"] = len(docs["train"]) + len(docs["eval"])
    meta["tokens"] = meta["train_tokens"]
    meta["bytes"] = used_bytes
    _write_atomic(out / META_NAME, (json.dumps(meta, indent=2) + "\n").encode())
    return meta


def _write_shards(out: Path, prefix: str, encoded: list[np.ndarray], shard_tokens: int) -> list[dict]:
    shards: list[dict] = []
    if not encoded:
        return shards
    stream = np.concatenate(encoded)
    for start in range(0, stream.size, shard_tokens):
        name = f"{prefix}-{len(shards):05d}.bin"
        chunk = stream[start:start + shard_tokens]
        _write_atomic(out / name, chunk.tobytes())
        shards.append({"name": name, "tokens": int(chunk.size)})
    return shards


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class TokenShards:
    """All shards of a prepared directory as one read-only token stream (memory-mapped, nothing loaded)."""

    def __init__(self, path: str | Path, split: str = "train"):
        self.path = Path(path).expanduser()
        meta_file = self.path / META_NAME
        if not meta_file.exists():
            raise FileNotFoundError(f"{self.path} holds no prepared data ({META_NAME} missing); "
                                    f"run `sigma train prepare --out {self.path}`")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
        self.meta = json.loads(meta_file.read_text())
        self.vocab_size = int(self.meta["vocab_size"])
        self.split = split
        entries = self.meta["shards"] if split == "train" else self.meta.get("eval_shards")
        if not entries:
            raise ValueError(f"{meta_file}: no held-out split (eval_shards); prepare the data again with an "
                             "eval fraction above 0, or set eval.every=0")
        self.maps = [np.memmap(self.path / s["name"], dtype=TOKEN_DTYPE, mode="r") for s in entries]
        self.offsets = np.cumsum([0] + [m.size for m in self.maps])
        self.num_tokens = int(self.offsets[-1])

    def files(self) -> list[Path]:
        return [Path(m.filename) for m in self.maps]

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) of the concatenated stream, crossing shard borders if needed."""
        if start < 0 or start + length > self.num_tokens:
            raise IndexError(f"tokens [{start}, {start + length}) outside 0..{self.num_tokens}")
        out = np.empty(length, dtype=np.int64)
        filled = 0
        shard = int(np.searchsorted(self.offsets, start, side="right")) - 1
        while filled < length:
            begin = start + filled - int(self.offsets[shard])
            take = min(length - filled, self.maps[shard].size - begin)
            out[filled:filled + take] = self.maps[shard][begin:begin + take]
            filled += take
            shard += 1
        return out


@dataclass
class SamplerState:
    seed: int
    step: int  # the next step whose batch will be drawn


class WindowSampler:
    """Deterministic batches of (seq_len + 1)-token windows, a pure function of (seed, step).

    The stream is cut into non-overlapping windows; each epoch visits all of them in an order drawn from
    (seed, epoch). Step s takes global batch rows [s*B, (s+1)*B) of that endless order and each data-parallel
    rank its contiguous slice, so the global batch is the same for any number of ranks, and resuming needs
    nothing but the step number.
    """

    def __init__(self, shards: TokenShards, seq_len: int, global_batch: int, seed: int = 0,
                 dp_rank: int = 0, dp_size: int = 1):
        if global_batch % dp_size:
            raise ValueError(f"global_batch {global_batch} is not divisible by {dp_size} data-parallel ranks")
        self.shards = shards
        self.seq_len = seq_len
        self.global_batch = global_batch
        self.local_batch = global_batch // dp_size
        self.dp_rank = dp_rank
        self.num_windows = (shards.num_tokens - 1) // seq_len
        if self.num_windows < global_batch:
            raise ValueError(f"data has {shards.num_tokens} tokens: fewer than global_batch={global_batch} "
                             f"windows of seq_len={seq_len}; prepare more data")
        self.state = SamplerState(seed=seed, step=0)
        self._orders: dict[int, np.ndarray] = {}

    def _window(self, index: int) -> int:
        epoch, within = divmod(index, self.num_windows)
        order = self._orders.get(epoch)
        if order is None:
            self._orders = {epoch: np.random.default_rng([self.state.seed, epoch]).permutation(self.num_windows)}
            order = self._orders[epoch]
        return int(order[within])

    def batch(self, step: int) -> np.ndarray:
        """This rank's rows of step's global batch: int64 array [local_batch, seq_len + 1]."""
        first = step * self.global_batch + self.dp_rank * self.local_batch
        rows = [self.shards.read(self._window(first + i) * self.seq_len, self.seq_len + 1)
                for i in range(self.local_batch)]
        return np.stack(rows)

    def next(self) -> np.ndarray:
        rows = self.batch(self.state.step)
        self.state.step += 1
        return rows

    def state_dict(self) -> dict:
        return {"seed": self.state.seed, "step": self.state.step}

    def load_state_dict(self, state: dict) -> None:
        if int(state["seed"]) != self.state.seed:
            raise ValueError(f"checkpoint sampler seed {state['seed']} differs from the configured {self.state.seed}")
        self.state.step = int(state["step"])
