"""In-memory peer replicas: every `checkpoint.replica_every` steps each rank keeps a host-memory copy of its state
and sends one to a peer rank on another node, so a node that dies without warning loses nothing its peer holds.

Host memory is node-local shared memory (`checkpoint.replica_dir`, default /dev/shm/sigma-replicas, a tmpfs):
it outlives the training processes (SLURM kills them all on a requeue) but not the node. Each node keeps, under
`<replica_dir>/<node>/<run>/`, its ranks' own copies and the copies their peers sent, each as a payload file and a
manifest (run, config fingerprint, world size, ep, step, source rank, SHA-256), written by rename: a replica
is either whole or absent.

The copy is taken between steps (tensors cloned to CPU: training goes on at once) and written and sent from a
thread over a gloo group of its own, overlapping the next steps; the next replication waits for it. Peer of rank r:
r + ranks-per-node (mod world), i.e. the same local rank on the next node.

On start (`restore`), after the newest complete disk checkpoint was found: every rank lists the replicas its node
holds, the ranks agree (all-gather) on the newest step at which every rank's state is held somewhere, and if that
step is newer than the disk checkpoint, each rank gets its state from a node that holds it (its own, or over the
network from the peer's node) and resumes from it. Replicas from another run or config, corrupt or partial ones
are skipped with a `replica_ignored` event naming the file; the disk checkpoint is used when no complete newer set
exists.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import threading
from pathlib import Path

import torch

KEEP = 2  # versions kept per source rank: a crash mid-replication leaves the previous complete set
SHARED_NAME = "replicas"  # under the checkpoint directory: replicas kept on disk by a rank answering while blocked
ON_DISK = -1  # holder of a replica on the shared checkpoint filesystem (every rank reads it itself)


def fingerprint(cfg) -> str:
    """What must match for a replica to be loadable: the model, its overrides, the layout and the data order."""
    key = {"model": cfg.model, "overrides": cfg.model_overrides, "parallel": [cfg.parallel.ep, cfg.parallel.tp,
           cfg.parallel.pp], "seed": cfg.seed, "data": [cfg.data.seq_len, cfg.data.global_batch, cfg.data.seed],
           "dtype": cfg.dtype}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def local_state(model, optimizer, named, rng: dict, trainer: dict) -> dict:
    """This rank's state as plain CPU tensors (its own expert shards, no DTensors): cloned, so training may go on."""
    with torch.no_grad():
        return {"model": {n: t.detach().to("cpu", copy=True) for n, t in model.state_dict().items()},
                "optim": {n: {k: optimizer.state[p][k].detach().to("cpu", copy=True)
                              for k in ("step", "exp_avg", "exp_avg_sq")} for n, p in named},
                "rng": rng, "trainer": trainer}


def apply_state(state: dict, model, optimizer, named) -> None:
    with torch.no_grad():
        live = model.state_dict()
        for n, t in state["model"].items():
            live[n].copy_(t)
        for n, p in named:
            for k in ("step", "exp_avg", "exp_avg_sq"):
                optimizer.state[p][k].copy_(state["optim"][n][k])


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
        if ctx.distributed:
            import torch.distributed as dist

            self.group = dist.new_group(backend="gloo")  # replica traffic never meets the training's collectives
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # ---------- replication ----------
    def after_step(self, step: int, take_state) -> None:
        """Every `every` steps: copy the state now, write and send it in the background."""
        if not self.every or step % self.every:
            return
        self.wait()
        state = take_state()
        self._thread = threading.Thread(target=self._replicate, args=(step, state), daemon=True,
                                        name="sigma-replica")
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            self.event("replica_failed", f"replica not kept: {error}")

    def _replicate(self, step: int, state: dict) -> None:
        try:
            buf = io.BytesIO()
            torch.save(state, buf)
            payload = buf.getvalue()
            # exchange first: a write that fails here (a full tmpfs) must not leave the peer waiting for our send
            received = (self._exchange(payload) if self.group is not None and self.send_to != self.ctx.rank
                        else None)
            self._write(self.ctx.rank, step, payload)
            if received is not None:
                self._write(self.recv_from, step, received)
        except BaseException as exc:  # reported by the next wait(); training goes on without this replica
            self._error = exc

    def _exchange(self, payload: bytes) -> bytes:
        """Send ours to send_to, receive recv_from's (sizes first: shards may differ in size)."""
        import torch.distributed as dist

        out = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        size_in = torch.zeros(1, dtype=torch.int64)
        reqs = [dist.isend(torch.tensor([out.numel()], dtype=torch.int64), self.send_to, group=self.group),
                dist.irecv(size_in, self.recv_from, group=self.group)]
        for r in reqs:
            r.wait()
        data = torch.empty(int(size_in.item()), dtype=torch.uint8)
        reqs = [dist.isend(out, self.send_to, group=self.group), dist.irecv(data, self.recv_from, group=self.group)]
        for r in reqs:
            r.wait()
        return data.numpy().tobytes()

    def _write(self, src: int, step: int, payload: bytes, where: Path | None = None, durable: bool = False) -> None:
        where = where or self.dir
        where.mkdir(parents=True, exist_ok=True)
        name = f"rank-{src}.step-{step:08d}"
        tag = f"{self.ctx.rank}-{threading.get_ident()}"  # ranks of one node, and two threads, may write one replica
        manifest = {"run": self.run, "fingerprint": self.fp, "world_size": self.ctx.world_size,
                    "ep": self.ctx.ep_size, "step": step, "rank": src, "bytes": len(payload),
                    "sha256": hashlib.sha256(payload).hexdigest()}
        files = [(where / f".{name}{suffix}.tmp-{tag}", where / f"{name}{suffix}", data)
                 for suffix, data in ((".pt", payload), (".json", json.dumps(manifest).encode()))]
        try:
            for tmp, _, data in files:
                with open(tmp, "wb") as f:
                    f.write(data)
                    if durable:  # on disk, not tmpfs: written through before the rename makes it visible
                        f.flush()
                        os.fsync(f.fileno())
        except BaseException:  # a full disk or tmpfs: no half-written file stays, the older replicas are untouched
            for tmp, _, _ in files:
                tmp.unlink(missing_ok=True)
            raise
        for tmp, final, _ in files:  # the manifest last: a replica is visible only once both are whole
            os.replace(tmp, final)
        for old in sorted(where.glob(f"rank-{src}.step-*.json"))[:-KEEP]:
            old.unlink(missing_ok=True)
            old.with_suffix(".pt").unlink(missing_ok=True)

    def keep_on_disk(self, step: int, state: dict) -> list[int]:
        """This rank's `state` of `step`, and every replica this node holds (the hung peer's among them; older
        steps too, should `step` of the peer never have arrived), written to the shared directory; returns the
        ranks now kept there for `step`."""
        for src, steps in self.held().items():
            for held in steps:
                if (src, held) == (self.ctx.rank, step):
                    continue
                try:
                    payload = (self.dir / f"rank-{src}.step-{held:08d}.pt").read_bytes()
                except OSError:  # pruned by the replication thread meanwhile: a newer one is there
                    continue
                self._write(src, held, payload, self.shared, durable=True)
        buf = io.BytesIO()
        torch.save(state, buf)
        self._write(self.ctx.rank, step, buf.getvalue(), self.shared, durable=True)  # last: never pruned
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
            payload = path.with_suffix(".pt").read_bytes()
        except (OSError, ValueError) as exc:
            return f"unreadable ({exc})"
        if m.get("run") != self.run or m.get("fingerprint") != self.fp:
            return f"from another run or config (run {m.get('run')!r}, config {m.get('fingerprint')!r})"
        if m.get("world_size") != self.ctx.world_size or m.get("ep") != self.ctx.ep_size:
            return f"written by {m.get('world_size')} ranks with ep={m.get('ep')}"
        if len(payload) != m.get("bytes") or hashlib.sha256(payload).hexdigest() != m.get("sha256"):
            return f"corrupt or partial ({len(payload)} bytes, checksum does not match the manifest)"
        return ""

    def restore(self, disk_step: int, model, optimizer, named) -> dict | None:
        """Every rank together: the newest replica set held across the nodes, if newer than disk_step, loaded into
        model and optimizer; returns its trainer/rng state ({"step", "sampler", "rng", "node"}) or None."""
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
        payload = None
        for src in range(self.ctx.world_size):  # the same order on every rank: one pair at a time
            holder = holders[(src, step)]
            if holder == ON_DISK:
                if src == self.ctx.rank:
                    payload = (self.shared / f"rank-{src}.step-{step:08d}.pt").read_bytes()
            elif holder == src == self.ctx.rank:
                payload = (self.dir / f"rank-{src}.step-{step:08d}.pt").read_bytes()
            elif self.ctx.rank == holder:
                data = (self.dir / f"rank-{src}.step-{step:08d}.pt").read_bytes()
                self._send(data, src)
            elif self.ctx.rank == src:
                payload = self._recv(holder)
        state = torch.load(io.BytesIO(payload), weights_only=False)
        apply_state(state, model, optimizer, named)
        holder = holders[(self.ctx.rank, step)]
        return {**state["trainer"], "rng": state["rng"],
                "holder": str(self.shared) if holder == ON_DISK else views[holder]["node"]}

    def _send(self, data: bytes, dst: int) -> None:
        import torch.distributed as dist

        dist.send(torch.tensor([len(data)], dtype=torch.int64), dst, group=self.group)
        dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst, group=self.group)

    def _recv(self, src: int) -> bytes:
        import torch.distributed as dist

        size = torch.zeros(1, dtype=torch.int64)
        dist.recv(size, src, group=self.group)
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(data, src, group=self.group)
        return data.numpy().tobytes()

    def close(self, finished: bool = False) -> None:
        """Wait for the replication in flight; a finished run (every rank together) frees the node's memory."""
        self.wait()
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
