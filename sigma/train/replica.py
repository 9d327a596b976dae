"""In-memory peer replicas: every `checkpoint.replica_every` steps each rank keeps a host-memory copy of its state
and sends one to a peer rank on another node, so a node that dies without warning loses nothing its peer holds.

Host memory is node-local shared memory (`checkpoint.replica_dir`, default /dev/shm/sigma-replicas, a tmpfs):
it outlives the training processes (SLURM kills them all on a requeue) but not the node. Each node keeps, under
`<replica_dir>/<node>/<run>/`, its ranks' own copies and the copies their peers sent, each as a payload file
(`rank-<R>.step-<N>.bin`: the tensors' bytes back to back, no pickling) and a manifest (`.json`: run, config
fingerprint, world size, ep, step, source rank, size, CRC-32C, and the layout: every tensor's name, dtype, shape and
offset, with the small rest of the state, sampler position and step), each made visible by a rename once whole
(the payload filled in place, the manifest written with one write, last): a replica is either whole or absent.

What a step pays: the step's state is copied (one copy per tensor) by a replication thread straight into the payload
file of its replica, mapped into the process, which then checksums it and exchanges it with the peer over a gloo
group of its own, the peer's received straight into a mapped payload file too (no write copies either again); the
training thread hands the step over and goes on (its next optimiser step waits only until the copy is taken, which
takes a small part of a forward and backward pass). A round that comes due while the previous one is still in flight on any
rank is skipped (every rank agrees, from a flag on the step's loss all-reduce) and the next step tries again: the
step never waits for a replica, and the KPI line says how far behind the replicas are (`replica_step`,
`replica_skipped`). Peer of rank r: r + ranks-per-node (mod world), i.e. the same local rank on the next node.

On start (`restore`), after the newest complete disk checkpoint was found: every rank lists the replicas its node
holds, the ranks agree (all-gather) on the newest step at which every rank's state is held somewhere, and if that
step is newer than the disk checkpoint, each rank gets its state from a node that holds it (its own, or over the
network from the peer's node) and resumes from it. Replicas from another run or config, corrupt or partial ones
are skipped with a `replica_ignored` event naming the file; the disk checkpoint is used when no complete newer set
exists.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import queue
import shutil
import threading
from pathlib import Path

import torch
from crc32c import crc32c

KEEP = 2  # versions kept per source rank: a crash mid-replication leaves the previous complete set
SHARED_NAME = "replicas"  # under the checkpoint directory: replicas kept on disk by a rank answering while blocked
ON_DISK = -1  # holder of a replica on the shared checkpoint filesystem (every rank reads it itself)
ALIGN = 64  # tensor offsets in a payload: every dtype's view of the buffer is aligned


def fingerprint(cfg) -> str:
    """What must match for a replica to be loadable: the model, its overrides, the layout and the data order."""
    key = {"model": cfg.model, "overrides": cfg.model_overrides, "parallel": [cfg.parallel.ep, cfg.parallel.tp,
           cfg.parallel.pp], "seed": cfg.seed, "data": [cfg.data.seq_len, cfg.data.global_batch, cfg.data.seed],
           "dtype": cfg.dtype}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def local_state(model, optimizer, named, rng: dict, trainer: dict, copy: bool = True) -> dict:
    """This rank's state (its own expert shards, no DTensors): cloned to CPU, so training may go on, or with
    copy=False the live tensors themselves (for a copy taken before the next optimiser step)."""
    take = (lambda t: t.detach().to("cpu", copy=True)) if copy else (lambda t: t.detach())
    with torch.no_grad():
        return {"model": {n: take(t) for n, t in model.state_dict().items()},
                "optim": {n: {k: take(optimizer.state[p][k]) for k in ("step", "exp_avg", "exp_avg_sq")}
                          for n, p in named},
                "rng": rng, "trainer": trainer}


def apply_state(state: dict, model, optimizer, named) -> None:
    with torch.no_grad():
        live = model.state_dict()
        for n, t in state["model"].items():
            live[n].copy_(t)
        for n, p in named:
            for k in ("step", "exp_avg", "exp_avg_sq"):
                optimizer.state[p][k].copy_(state["optim"][n][k])


# ---------- the payload format: tensors back to back, described by the manifest ----------

def _split(state) -> tuple[object, list[torch.Tensor]]:
    """(JSON skeleton with every tensor replaced by {"tensor": i}, the tensors in that order)."""
    tensors: list[torch.Tensor] = []

    def walk(value):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return {"tensor": len(tensors) - 1}
        if isinstance(value, dict):
            return {str(k): walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        return value
    return walk(state), tensors


def _layout(tensors: list[torch.Tensor]) -> tuple[list[list], int]:
    """[[dtype, shape, offset], ...] of the tensors in a flat buffer, and its size."""
    out, offset = [], 0
    for t in tensors:
        out.append([str(t.dtype).removeprefix("torch."), list(t.shape), offset])
        offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return out, offset


def _views(buffer: torch.Tensor, layout: list[list]) -> list[torch.Tensor]:
    views = []
    for dtype, shape, offset in layout:
        dt = getattr(torch, dtype)
        n = 1
        for d in shape:
            n *= d
        views.append(buffer[offset:offset + n * dt.itemsize].view(dt).view(shape))
    return views


def pack(state: dict) -> tuple[dict, torch.Tensor]:
    """(manifest fields "skeleton" and "layout", payload) of a state dict, copied once."""
    skeleton, tensors = _split(state)
    layout, size = _layout(tensors)
    payload = torch.zeros(size, dtype=torch.uint8)
    with torch.no_grad():
        for view, t in zip(_views(payload, layout), tensors):
            view.copy_(t)
    return {"skeleton": skeleton, "layout": layout}, payload


def unpack(manifest: dict, payload: bytes | bytearray | memoryview) -> dict:
    """The state dict a payload holds (tensors of their own: torch.set_rng_state ignores a view's offset)."""
    buffer = torch.frombuffer(payload, dtype=torch.uint8) if len(payload) else torch.empty(0, dtype=torch.uint8)
    views = [v.clone() for v in _views(buffer, manifest["layout"])]

    def walk(value):
        if isinstance(value, dict):
            return views[value["tensor"]] if set(value) == {"tensor"} else {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value
    return walk(manifest["skeleton"])


def checksum(payload) -> str:
    return f"{crc32c(memoryview(payload).cast('B')):08x}"  # hardware CRC-32C: several GB/s, a small part of a copy


class _Staging:
    """Where a state is copied, one copy per tensor: the payload file of its replica in node memory, mapped into
    this process (`target`), or else a preallocated buffer of the process; the layout is worked out again only when
    the state's tensors change (shapes, dtypes)."""

    def __init__(self):
        self.key = None
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.layout: list[list] = []
        self.size = 0
        self._views: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}  # id(buffer) -> (buffer, its views)

    def plan(self, state: dict) -> tuple[object, list[torch.Tensor]]:
        """(skeleton, tensors) of a state; sets layout and size."""
        skeleton, tensors = _split(state)
        key = tuple((t.dtype, tuple(t.shape)) for t in tensors)
        if key != self.key:
            self.layout, self.size = _layout(tensors)
            self.key, self._views = key, {}
            self.buffer = torch.empty(0, dtype=torch.uint8)
        return skeleton, tensors

    def fill(self, skeleton, tensors: list[torch.Tensor],
             target: torch.Tensor | None = None) -> tuple[dict, torch.Tensor]:
        if target is None:
            if self.buffer.numel() != self.size:
                self.buffer = torch.zeros(self.size, dtype=torch.uint8)  # zeros: the padding is checksummed
            target = self.buffer
        held = self._views.get(id(target))
        if held is None or held[0] is not target:
            held = self._views[id(target)] = (target, _views(target, self.layout))
            while len(self._views) > 2 * (KEEP + 2):  # the mapped files come round again: drop the oldest
                self._views.pop(next(iter(self._views)))
        if tensors:
            with torch.no_grad():
                torch._foreach_copy_(held[1], tensors)  # one call: one GIL release for all the tensors
        return {"skeleton": skeleton, "layout": self.layout}, target


class _MappedPayloads:
    """Payload files in node memory, each mapped into this process once: a round's state is copied, and the peer's
    received, straight into the file that becomes the replica, so no write copies it again. The file of a source
    rank's oldest replica, when it is pruned, becomes that source's spare and is taken for its next round, mapping
    and all (its tmpfs pages stay allocated and mapped). Space is allocated up front (posix_fallocate), so a full
    tmpfs is an error here, never a SIGBUS on a mapped page."""

    def __init__(self, limit: int):
        self.limit = limit  # files kept mapped: the replicas kept and the ones in flight
        self._held: dict[tuple[int, int], tuple[int, torch.Tensor]] = {}  # (dev, inode) -> (fd, buffer)

    def take(self, spare: Path, tmp: Path, size: int) -> torch.Tensor:
        """A file of `size` bytes at `tmp` (the spare moved there, when there is one), mapped."""
        tmp.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):  # no spare yet: a new file
            os.replace(spare, tmp)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)  # the held fd keeps the inode: its number is not reused meanwhile
            held = self._held.pop(key, None)
            if held is not None and held[1].numel() == size:
                os.close(fd)
                self._held[key] = held  # most recently used last
                return held[1]
            if held is not None:
                os.close(held[0])
            os.ftruncate(fd, size)
            if size:
                os.posix_fallocate(fd, 0, size)
            buffer = (torch.frombuffer(mmap.mmap(fd, size), dtype=torch.uint8) if size
                      else torch.empty(0, dtype=torch.uint8))
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        self._held[key] = (fd, buffer)
        while len(self._held) > self.limit:
            os.close(self._held.pop(next(iter(self._held)))[0])
        return buffer

    def close(self) -> None:
        for fd, _ in self._held.values():
            os.close(fd)
        self._held.clear()


class PeerReplicas:
    def __init__(self, root: str | Path, node: str, run: str, fp: str, ctx, every: int, ranks_per_node: int,
                 event=None, shared: str | Path | None = None):
        self.dir = Path(root) / node / run
        # replicas kept on the shared checkpoint filesystem by ranks that answered a request while blocked
        # (jit.BlockedAnswer): every node reads them, so they survive a restart on other nodes
        self.shared = Path(shared) if shared is not None else None
        self.node = node
        self.run = run
        self.fp = fp
        self.ctx = ctx
        self.every = every
        self.event = event or (lambda kind, message, **fields: None)
        world, rank = ctx.world_size, ctx.rank
        step = ranks_per_node if 0 < ranks_per_node < world else 1
        self.send_to, self.recv_from = (rank + step) % world, (rank - step) % world
        self.group = None
        self.nodes = [node] * world
        if ctx.distributed:
            import torch.distributed as dist

            self.group = dist.new_group(backend="gloo")  # replica traffic never meets the training's collectives
            dist.all_gather_object(self.nodes, node, group=self.group)
        # a peer on this very node (one-node runs) already keeps its own copy here: nothing to send or receive
        self.sends = self.group is not None and self.send_to != rank and self.nodes[self.send_to] != node
        self.receives = self.group is not None and self.recv_from != rank and self.nodes[self.recv_from] != node
        self.last = 0  # the step of the newest round started (the same on every rank)
        self.done_step = 0  # the newest step this rank's replica was written (KPI `replica_step`)
        self.skipped = 0  # rounds put off because the previous one was still in flight (KPI `replica_skipped`)
        self._staging = _Staging()
        self._incoming = torch.empty(0, dtype=torch.uint8)  # where the peer's payload goes when no file can take it
        self._mapped = _MappedPayloads(2 * (KEEP + 1))  # own and peer's: the kept replicas and the one in flight
        self._idle = threading.Event()  # no round in flight
        self._idle.set()
        self._copied = threading.Event()  # the round in flight has copied the state: training may change it
        self._copied.set()
        self._error: BaseException | None = None
        self._work: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    # ---------- replication ----------
    def busy(self) -> bool:
        return not self._idle.is_set()

    def after_step(self, step: int, take_state, busy_anywhere: bool | None = None) -> None:
        """At the end of step `step` (every rank): start a round when one is due and none is in flight on any rank
        (`busy_anywhere`, agreed by the ranks; None: this rank's own thread decides, for a single process or a
        caller that waited). `take_state()` gives the state to copy (live tensors may be given: the copy is taken
        before `wait_copied` returns)."""
        self._report()
        if not self.every or step - self.last < self.every:
            return
        if self.busy() if busy_anywhere is None else busy_anywhere:
            self.skipped += 1  # due, but the previous round is still in flight somewhere: the next step tries
            return
        self.last = step
        state = take_state()  # in this thread: the RNG state and sampler position are this step's
        self._idle.clear()
        self._copied.clear()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, daemon=True, name="sigma-replica")
            self._thread.start()
        self._work.put((step, state))

    def wait_copied(self) -> None:
        """Before the training thread changes the state (the optimiser step): the round in flight has its copy."""
        self._copied.wait()

    def wait(self) -> None:
        """Until the round in flight is written (and exchanged); a failed round becomes a `replica_failed` event."""
        self._idle.wait()
        self._report()

    def _report(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            self.event("replica_failed", f"replica not kept: {error}")

    def kpis(self) -> dict:
        return {"replica_step": self.done_step, "replica_skipped": self.skipped}

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            try:
                self._replicate(*item)
            except BaseException as exc:  # reported by the next after_step/wait; training goes on without it
                self._error = exc
            finally:
                self._copied.set()
                self._idle.set()

    def _replicate(self, step: int, state: dict) -> None:
        mine, payload, failure, own = None, None, "", None
        try:
            skeleton, tensors = self._staging.plan(state)
            own = self._take(self.ctx.rank, step, self._staging.size)
            fields, payload = self._staging.fill(skeleton, tensors, own and own[1])
            mine = {**self._manifest(self.ctx.rank, step, payload), **fields}
        except Exception as exc:  # the peer still gets our header, so it never waits for a payload
            failure = f"{type(exc).__name__}: {exc}"
        finally:
            self._copied.set()
            del state
        written, into = own and own[0], None
        try:
            # exchange first: a write that fails here (a full tmpfs) must not leave the peer waiting for our send
            theirs, incoming, into = (self._exchange(mine, payload, failure, step) if (self.sends or self.receives)
                                      else (None, None, None))
            if mine is None:
                raise RuntimeError(f"the state of step {step} could not be copied: {failure}")
            self._write(self.dir, mine, payload, written=written)
            written = None
            if theirs is not None:
                self._write(self.dir, theirs, incoming, written=into)
                into = None
        finally:  # a payload file not made a replica is removed: nothing half-written stays
            for left in (written, into):
                if left is not None:
                    left.unlink(missing_ok=True)
        self.done_step = step

    def _take(self, src: int, step: int, size: int) -> tuple[Path, torch.Tensor] | None:
        """(temporary name, mapping) of a payload file in node memory for source rank `src`'s replica of `step`;
        None where none can be had (a file system without posix_fallocate, a full one): the payload then goes to
        a buffer of this process and is written as before, where a full tmpfs is a clear error."""
        tmp = self.dir / f".rank-{src}.step-{step:08d}.bin.tmp-{self.ctx.rank}-{threading.get_ident()}"
        try:
            return tmp, self._mapped.take(self.dir / f".spare.rank-{src}", tmp, size)
        except Exception:  # never raised to the exchange: the peer's send must complete
            return None

    def _manifest(self, src: int, step: int, payload: torch.Tensor) -> dict:
        return {"run": self.run, "fingerprint": self.fp, "world_size": self.ctx.world_size, "ep": self.ctx.ep_size,
                "step": step, "rank": src, "node": self.node, "bytes": payload.numel(),
                "crc32c": checksum(payload.numpy())}

    def _exchange(self, mine: dict | None, payload: torch.Tensor | None, failure: str,
                  step: int) -> tuple[dict | None, torch.Tensor | None, Path | None]:
        """Send our manifest and payload to send_to, receive recv_from's (manifest sizes first) straight into a
        payload file in node memory; returns (their manifest, their payload, its file: None where it went to a
        buffer of this process instead, see `_take`)."""
        import torch.distributed as dist

        header = json.dumps(mine if mine is not None else {"failed": failure}).encode()
        reqs, size_in = [], torch.zeros(1, dtype=torch.int64)
        if self.sends:
            reqs.append(dist.isend(torch.tensor([len(header)], dtype=torch.int64), self.send_to, group=self.group))
        if self.receives:
            reqs.append(dist.irecv(size_in, self.recv_from, group=self.group))
        for r in reqs:
            r.wait()
        reqs, header_in = [], torch.empty(int(size_in.item()), dtype=torch.uint8)
        if self.sends:
            reqs.append(dist.isend(torch.frombuffer(bytearray(header), dtype=torch.uint8), self.send_to,
                                   group=self.group))
        if self.receives:
            reqs.append(dist.irecv(header_in, self.recv_from, group=self.group))
        for r in reqs:
            r.wait()
        theirs = json.loads(header_in.numpy().tobytes()) if self.receives else None
        if theirs is not None and "failed" in theirs:
            theirs = None  # the peer could not copy its state this round: nothing comes
        reqs, incoming, into = [], None, None
        if self.sends and mine is not None and payload.numel():
            reqs.append(dist.isend(payload, self.send_to, group=self.group))
        if theirs is not None:
            taken = self._take(theirs["rank"], step, theirs["bytes"])
            if taken is None:
                if self._incoming.numel() != theirs["bytes"]:
                    self._incoming = torch.empty(theirs["bytes"], dtype=torch.uint8)
                incoming = self._incoming
            else:
                into, incoming = taken
            if theirs["bytes"]:
                reqs.append(dist.irecv(incoming, self.recv_from, group=self.group))
        try:
            for r in reqs:
                r.wait()
        except BaseException:
            if into is not None:
                into.unlink(missing_ok=True)
            raise
        return theirs, incoming, into

    def _write(self, where: Path, manifest: dict, payload, durable: bool = False,
               written: Path | None = None) -> None:
        """One replica under `where`: the payload with one write (or already in the file `written`, a mapped one),
        then the manifest, each by rename (the manifest last: a replica is visible only once both are whole); the
        versions past KEEP of its source are dropped, the payload file of the oldest kept to be written over next
        time (tmpfs pages stay allocated)."""
        where.mkdir(parents=True, exist_ok=True)
        src, step = manifest["rank"], manifest["step"]
        name = f"rank-{src}.step-{step:08d}"
        tag = f"{self.ctx.rank}-{threading.get_ident()}"  # ranks of one node, and two threads, may write one replica
        spare = where / f".spare.rank-{src}"  # one writer per source rank on a node (see `sends`)
        tmp_payload, tmp_manifest = written or where / f".{name}.bin.tmp-{tag}", where / f".{name}.json.tmp-{tag}"
        try:
            if written is None:
                data = memoryview(payload.numpy() if isinstance(payload, torch.Tensor) else payload).cast("B")
                if not durable and spare.exists():
                    os.replace(spare, tmp_payload)
                with open(tmp_payload, "r+b" if tmp_payload.exists() else "wb") as f:
                    f.write(data)
                    f.truncate()
                    if durable:  # on disk, not tmpfs: written through before the rename makes it visible
                        f.flush()
                        os.fsync(f.fileno())
            with open(tmp_manifest, "wb") as f:
                f.write(json.dumps(manifest).encode())
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException:  # a full disk or tmpfs: no half-written file stays, the older replicas are untouched
            tmp_payload.unlink(missing_ok=True)
            tmp_manifest.unlink(missing_ok=True)
            raise
        os.replace(tmp_payload, where / f"{name}.bin")
        os.replace(tmp_manifest, where / f"{name}.json")
        for old in sorted(where.glob(f"rank-{src}.step-*.json"))[:-KEEP]:
            old.unlink(missing_ok=True)  # the manifest first: the replica is gone before its payload is reused
            if durable:
                old.with_suffix(".bin").unlink(missing_ok=True)
            else:
                try:
                    os.replace(old.with_suffix(".bin"), spare)
                except FileNotFoundError:
                    pass

    def write_bytes(self, src: int, step: int, payload: bytes) -> None:
        """A replica of source rank `src` made of `payload` (bytes with no layout: what a test damages or skips)."""
        manifest = {"run": self.run, "fingerprint": self.fp, "world_size": self.ctx.world_size,
                    "ep": self.ctx.ep_size, "step": step, "rank": src, "node": self.node, "bytes": len(payload),
                    "crc32c": checksum(payload), "skeleton": None, "layout": []}
        self._write(self.dir, manifest, payload)

    def keep_on_disk(self, step: int, state: dict) -> list[int]:
        """This rank's `state` of `step`, and every replica this node holds (the hung peer's among them; older
        steps too, should `step` of the peer never have arrived), written to the shared directory; returns the
        ranks now kept there for `step`."""
        for src, steps in self.held().items():
            for held in steps:
                if (src, held) == (self.ctx.rank, step):
                    continue
                name = f"rank-{src}.step-{held:08d}"
                try:
                    manifest = json.loads((self.dir / f"{name}.json").read_text())
                    payload = (self.dir / f"{name}.bin").read_bytes()
                except (OSError, ValueError):  # pruned by the replication thread meanwhile: a newer one is there
                    continue
                if len(payload) != manifest.get("bytes") or checksum(payload) != manifest.get("crc32c"):
                    continue  # written over by the replication thread between the two reads
                self._write(self.shared, manifest, payload, durable=True)
        fields, payload = pack(state)
        self._write(self.shared, {**self._manifest(self.ctx.rank, step, payload), **fields}, payload,
                    durable=True)  # last: never pruned
        return sorted(src for src, steps in self._held_in(self.shared).items() if step in steps)

    # ---------- restore ----------
    def held(self) -> dict[int, list[int]]:
        """{source rank: [steps]} of the valid replicas on this node; every invalid one is an event."""
        return self._held_in(self.dir)

    def _held_in(self, where: Path | None) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        if where is None or not where.is_dir():
            return out
        for path in sorted(where.glob("rank-*.step-*.json")):
            problem = self._check(path)
            if problem:
                self.event("replica_ignored", f"replica {path} ignored: {problem}", path=str(path))
                continue
            m = json.loads(path.read_text())
            out.setdefault(int(m["rank"]), []).append(int(m["step"]))
        return out

    def _check(self, path: Path) -> str:
        try:
            m = json.loads(path.read_text())
            payload = path.with_suffix(".bin").read_bytes()
        except (OSError, ValueError) as exc:
            return f"unreadable ({exc})"
        if not isinstance(m, dict):
            return "unreadable (not a manifest)"
        if m.get("run") != self.run or m.get("fingerprint") != self.fp:
            return f"from another run or config (run {m.get('run')!r}, config {m.get('fingerprint')!r})"
        if m.get("world_size") != self.ctx.world_size or m.get("ep") != self.ctx.ep_size:
            return f"written by {m.get('world_size')} ranks with ep={m.get('ep')}"
        if len(payload) != m.get("bytes") or checksum(payload) != m.get("crc32c"):
            return f"corrupt or partial ({len(payload)} bytes, checksum does not match the manifest)"
        return ""

    def _read(self, where: Path, src: int, step: int) -> tuple[bytes, bytes]:
        name = f"rank-{src}.step-{step:08d}"
        return (where / f"{name}.json").read_bytes(), (where / f"{name}.bin").read_bytes()

    def restore(self, disk_step: int, model, optimizer, named) -> dict | None:
        """Every rank together: the newest replica set held across the nodes, if newer than disk_step, loaded into
        model and optimizer; returns its trainer/rng state ({"step", "sampler", "rng", "node"}) or None."""
        # payload files a killed run was filling: no round is in flight on this node before this collective
        for left in self.dir.glob(f".rank-*.step-*.bin.tmp-{self.ctx.rank}-*"):
            left.unlink(missing_ok=True)
        # what the shared directory holds is rank 0's reading, so that every rank plans the same transfers
        mine = {"node": self.node, "held": self.held(),
                "shared": self._held_in(self.shared) if self.ctx.rank == 0 else {}}
        views = [mine]
        if self.ctx.distributed:
            import torch.distributed as dist

            views = [None] * self.ctx.world_size
            dist.all_gather_object(views, mine, group=self.group)
        holders: dict[tuple[int, int], int] = {}  # (source rank, step) -> the lowest rank on a node holding it
        for src, steps in views[0]["shared"].items():  # on the shared disk: each rank reads its own
            for s in steps:
                holders[(int(src), s)] = ON_DISK
        for rank, view in enumerate(views):
            first_on_node = next(r for r, v in enumerate(views) if v["node"] == view["node"])
            for src, steps in view["held"].items():
                for s in steps:
                    holders.setdefault((int(src), s), first_on_node)
        steps = {s for (_, s) in holders}
        complete = [s for s in steps if all((r, s) in holders for r in range(self.ctx.world_size))]
        step = max(complete, default=0)
        if step <= disk_step:
            return None
        got = None
        for src in range(self.ctx.world_size):  # the same order on every rank: one pair at a time
            holder = holders[(src, step)]
            if holder == ON_DISK:
                if src == self.ctx.rank:
                    got = self._read(self.shared, src, step)
            elif holder == src == self.ctx.rank:
                got = self._read(self.dir, src, step)
            elif self.ctx.rank == holder:
                for data in self._read(self.dir, src, step):
                    self._send(data, src)
            elif self.ctx.rank == src:
                got = self._recv(holder), self._recv(holder)
        manifest, payload = got
        state = unpack(json.loads(manifest), bytearray(payload))
        apply_state(state, model, optimizer, named)
        self.last = self.done_step = step
        holder = holders[(self.ctx.rank, step)]
        return {**state["trainer"], "rng": state["rng"],
                "holder": str(self.shared) if holder == ON_DISK else views[holder]["node"]}

    def _send(self, data: bytes, dst: int) -> None:
        import torch.distributed as dist

        dist.send(torch.tensor([len(data)], dtype=torch.int64), dst, group=self.group)
        if data:
            dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst, group=self.group)

    def _recv(self, src: int) -> bytes:
        import torch.distributed as dist

        size = torch.zeros(1, dtype=torch.int64)
        dist.recv(size, src, group=self.group)
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        if data.numel():
            dist.recv(data, src, group=self.group)
        return data.numpy().tobytes()

    def close(self, finished: bool = False) -> None:
        """Wait for the round in flight and stop the thread; a finished run (every rank together) frees the node's
        memory."""
        self.wait()
        if self._thread is not None:
            self._work.put(None)
            self._thread.join()
            self._thread = None
        self._mapped.close()
        self._staging = _Staging()  # its views of the mapped files go too
        if finished:
            if self.group is not None:
                import torch.distributed as dist

                dist.barrier(group=self.group)
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.ctx.rank == 0 and self.shared is not None:
                shutil.rmtree(self.shared, ignore_errors=True)


def peer_replicas(cfg, ctx, kpi, ckpt_root: Path) -> PeerReplicas | None:
    """The run's replicas (None when checkpoint.replica_every is 0). The run is named by its checkpoint directory."""
    if not cfg.checkpoint.replica_every:
        return None
    if cfg.parallel.tp > 1 or cfg.parallel.pp > 1 or cfg.parallel.shard_optimizer:
        raise ValueError("[checkpoint.replica_every]: in-memory replicas are implemented for data and expert "
                         "parallel layouts only, not yet with parallel.tp, parallel.pp or parallel.shard_optimizer; "
                         "set checkpoint.replica_every=0")
    run = hashlib.sha256(str(Path(ckpt_root).resolve()).encode()).hexdigest()[:12]
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or cfg.launch.gpus_per_node or 1)
    return PeerReplicas(cfg.checkpoint.replica_dir, kpi.node, run, fingerprint(cfg), ctx,
                        cfg.checkpoint.replica_every, ranks_per_node, event=kpi.event,
                        shared=Path(ckpt_root) / SHARED_NAME)


def resume_from_replicas(replicas: PeerReplicas, step: int, model, optimizer, named, sampler, ctx, kpi,
                         restore_rng) -> int | None:
    """Every rank together, before the disk checkpoint of `step` is read: a newer complete replica set is loaded;
    returns its step, or None when the disk checkpoint is the newest (then nothing was changed)."""
    restored = replicas.restore(step, model, optimizer, named)
    if restored is None:
        return None
    restore_rng(restored["rng"], ctx)
    sampler.load_state_dict(restored["sampler"])
    newer = int(restored["step"])
    where = (f"kept on the checkpoint filesystem by a rank that answered while blocked ({restored['holder']})"
             if replicas.shared is not None and restored["holder"] == str(replicas.shared)
             else f"held in the memory of {restored['holder']}")
    if ctx.rank == 0:  # the job's log says where the state came from
        print(f"sigma train: resuming from the replica of step {newer} {where} (disk checkpoint: step {step})",
              flush=True)
    kpi.event("resume", f"resumed from the replica of step {newer} {where} (newer than the disk checkpoint of "
                        f"step {step})", step=newer, checkpoint="replica",
              holder=restored["holder"], disk_step=step, rng_restored=True, checkpoint_kind="replica")
    return newer
