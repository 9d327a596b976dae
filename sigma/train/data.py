"""Training data: an offline byte tokenizer, memory-mapped token shards, and a deterministic resumable sampler.

The demo corpus is the Python standard library's own sources, which exist wherever Python does, so every
machine (CI, laptops, compute nodes without internet) trains on the same real text without downloads.

Layout of a prepared directory (`sigma train prepare --out DIR`):
    DIR/shard-00000.bin ...   uint16 token ids, one flat stream per shard, documents separated by EOS
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
TOKEN_DTYPE = np.uint16


class ByteTokenizer:
    """Bytes 0..255 are their own ids; id 256 marks the end of a document. No files, no downloads."""

    name = "byte"
    eos_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_document(self, data: bytes) -> np.ndarray:
        out = np.empty(len(data) + 1, dtype=TOKEN_DTYPE)
        out[:-1] = np.frombuffer(data, dtype=np.uint8)
        out[-1] = self.eos_id
        return out

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


TOKENIZERS = {"byte": ByteTokenizer}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(source: Path) -> list[Path]:
    """Python sources under source in a stable order; installed third-party packages are not the stdlib."""
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = [p for p in source.rglob("*.py") if p.is_file() and not skip.intersection(p.relative_to(source).parts)]
    return sorted(files, key=lambda p: p.relative_to(source).as_posix())


def prepare(out: str | Path, source: str | Path | None = None, max_mb: float = 16.0,
            shard_tokens: int = 4_000_000, tokenizer: str = "byte") -> dict:
    """Tokenize the corpus under source (default: the stdlib) into shards under out; return the metadata."""
    out = Path(out).expanduser()
    source = Path(source).expanduser() if source else stdlib_dir()
    if not source.is_dir():
        raise FileNotFoundError(f"corpus directory {source} does not exist")
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; valid: {', '.join(TOKENIZERS)}")
    if shard_tokens < 1024:
        raise ValueError(f"shard_tokens must be at least 1024, got {shard_tokens}")
    tok = TOKENIZERS[tokenizer]()
    out.mkdir(parents=True, exist_ok=True)
    (out / META_NAME).unlink(missing_ok=True)  # the directory is incomplete until the new meta lands
    budget = int(max_mb * 1e6)
    shards: list[dict] = []
    pending: list[np.ndarray] = []
    pending_tokens = 0
    used_bytes = documents = 0

    def flush(chunk: np.ndarray) -> None:
        name = f"shard-{len(shards):05d}.bin"
        _write_atomic(out / name, chunk.tobytes())
        shards.append({"name": name, "tokens": int(chunk.size)})

    for path in corpus_files(source):
        if used_bytes >= budget:
            break
        data = path.read_bytes()[: budget - used_bytes]
        used_bytes += len(data)
        documents += 1
        pending.append(tok.encode_document(data))
        pending_tokens += pending[-1].size
        while pending_tokens >= shard_tokens:
            stream = np.concatenate(pending)
            flush(stream[:shard_tokens])
            pending = [stream[shard_tokens:]]
            pending_tokens = pending[0].size
    if pending_tokens:
        flush(np.concatenate(pending))
    if not shards:
        raise ValueError(f"no Python sources found under {source}")
    meta = {"format": 1, "tokenizer": tok.name, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id,
            "dtype": np.dtype(TOKEN_DTYPE).name, "source": str(source), "documents": documents,
            "tokens": sum(s["tokens"] for s in shards), "shards": shards}
    _write_atomic(out / META_NAME, (json.dumps(meta, indent=2) + "\n").encode())
    return meta


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class TokenShards:
    """All shards of a prepared directory as one read-only token stream (memory-mapped, nothing loaded)."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        meta_file = self.path / META_NAME
        if not meta_file.exists():
            raise FileNotFoundError(f"{self.path} holds no prepared data ({META_NAME} missing); "
                                    f"run `sigma train prepare --out {self.path}`")
        self.meta = json.loads(meta_file.read_text())
        self.vocab_size = int(self.meta["vocab_size"])
        self.maps = [np.memmap(self.path / s["name"], dtype=TOKEN_DTYPE, mode="r") for s in self.meta["shards"]]
        self.offsets = np.cumsum([0] + [m.size for m in self.maps])
        self.num_tokens = int(self.offsets[-1])

    def files(self) -> list[Path]:
        return [self.path / s["name"] for s in self.meta["shards"]]

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
