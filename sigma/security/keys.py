"""Ingest keys: one HMAC key per node, a key table on the controller and one key file on each node.

Key table (controller, root-only mode 0600, JSON; `sigma keys` edits it, the controller re-reads it when it changes):

    {"version": 1, "keys": [{"id": "node1-5f0c3a9e", "node": "node1", "secret": "<64 hex>",
                             "created": 1732230000.0, "expires": null}, ...]}

A key with "expires" set is an old key in its rotation grace period: accepted until then, dropped after.

Node key file (on the node, root-only mode 0600): one line "<key id> <secret>". A file with a single token is a
shared secret (the older setup): any holder can post as any node, so the controller accepts it only when
`ingest_secret_file` is configured, warns at start and `sigma report` says so.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("sigma.security.keys")

DEFAULT_TABLE = "/etc/sigma/ingest-keys.json"
DEFAULT_KEY_DIR = "/etc/sigma/keys"  # `sigma keys issue` writes <node>.key here; install it as the node's key file
DEFAULT_GRACE_S = 3600.0
MIN_SECRET_BYTES = 16


class KeyFileError(ValueError):
    """A key file or key table that cannot be used (named, with the reason)."""


@dataclass(frozen=True)
class NodeKey:
    """What a sidecar signs with: key_id None = the shared secret."""

    key_id: str | None
    secret: bytes


@dataclass
class Key:
    id: str
    node: str
    secret: str
    created: float
    expires: float | None = None

    def active(self, now: float) -> bool:
        return self.expires is None or now < self.expires


def read_private(path: str | Path, what: str) -> bytes:
    """The bytes of a regular file of mode 0600 (or stricter) owned by this user; KeyFileError naming it otherwise."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"{path}: the {what} must be a regular file")
    if st.st_mode & 0o077:
        raise KeyFileError(f"{path}: the {what} has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0600 "
                        f"(chmod 600 {path})")
    if st.st_uid != os.geteuid():
        raise KeyFileError(f"{path}: the {what} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}); "
                        f"chown it")
    return path.read_bytes()


def write_private(path: str | Path, data: bytes) -> None:
    """Atomically replace path with data, mode 0600 from the first byte."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_node_key(path: str | Path) -> NodeKey:
    """A node key file ("<key id> <secret>") or a shared secret file ("<secret>")."""
    tokens = read_private(path, "ingest key").split()
    if len(tokens) not in (1, 2):
        raise KeyFileError(f"{path}: expected one line '<key id> <secret>' (or a shared secret), found "
                        f"{len(tokens)} fields")
    secret = tokens[-1]
    if len(secret) < MIN_SECRET_BYTES:
        raise KeyFileError(f"{path}: the secret is shorter than {MIN_SECRET_BYTES} bytes")
    key_id = tokens[0].decode("ascii", "replace") if len(tokens) == 2 else None
    return NodeKey(key_id, secret)


def node_key_text(key: Key) -> bytes:
    return f"{key.id} {key.secret}\n".encode()


class KeyTable:
    """The controller's key table file: load, edit (issue, rotate, revoke), save."""

    def __init__(self, path: str | Path = DEFAULT_TABLE):
        self.path = Path(path)
        self.keys: list[Key] = []

    def load(self, *, missing_ok: bool = False) -> "KeyTable":
        if missing_ok and not self.path.exists():
            self.keys = []
            return self
        raw = read_private(self.path, "key table")
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise KeyFileError(f"{self.path}: not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("keys"), list):
            raise KeyFileError(f"{self.path}: expected {{\"version\": 1, \"keys\": [...]}}")
        keys, seen = [], set()
        for i, k in enumerate(data["keys"]):
            try:
                key = Key(**k)
            except TypeError as exc:
                raise KeyFileError(f"{self.path}: keys[{i}]: {exc}") from None
            if not (isinstance(key.id, str) and isinstance(key.node, str) and isinstance(key.secret, str)
                    and len(key.secret) >= MIN_SECRET_BYTES):
                raise KeyFileError(f"{self.path}: keys[{i}]: id, node and a secret of at least {MIN_SECRET_BYTES} "
                                f"characters are required")
            if key.id in seen:
                raise KeyFileError(f"{self.path}: keys[{i}]: duplicate key id {key.id!r}")
            seen.add(key.id)
            keys.append(key)
        self.keys = keys
        return self

    def save(self) -> None:
        data = {"version": 1, "keys": [asdict(k) for k in self.keys]}
        write_private(self.path, (json.dumps(data, indent=1) + "\n").encode())

    def for_node(self, node: str, now: float | None = None) -> list[Key]:
        now = time.time() if now is None else now
        return [k for k in self.keys if k.node == node and k.active(now)]

    def issue(self, node: str, now: float | None = None) -> Key:
        now = time.time() if now is None else now
        if self.for_node(node, now):
            raise KeyFileError(f"node {node} already has a key; use `sigma keys rotate {node}`")
        return self._new(node, now)

    def rotate(self, node: str, grace_s: float = DEFAULT_GRACE_S, now: float | None = None) -> Key:
        """A new key for node; its current keys stay valid for grace_s so the node can switch without a gap."""
        now = time.time() if now is None else now
        old = self.for_node(node, now)
        if not old:
            raise KeyFileError(f"node {node} has no key to rotate; use `sigma keys issue {node}`")
        for k in old:
            k.expires = now + grace_s if k.expires is None else min(k.expires, now + grace_s)
        return self._new(node, now)

    def revoke(self, name: str) -> list[Key]:
        """Remove a key by id, or every key of a node; returns what was removed."""
        gone = [k for k in self.keys if name in (k.id, k.node)]
        if not gone:
            raise KeyFileError(f"no key or node named {name!r} in {self.path}")
        self.keys = [k for k in self.keys if k not in gone]
        return gone

    def prune(self, now: float | None = None) -> list[Key]:
        now = time.time() if now is None else now
        gone = [k for k in self.keys if not k.active(now)]
        self.keys = [k for k in self.keys if k.active(now)]
        return gone

    def _new(self, node: str, now: float) -> Key:
        if not node or any(c.isspace() for c in node):
            raise KeyFileError(f"bad node name {node!r}")
        key = Key(id=f"{node}-{secrets.token_hex(4)}", node=node, secret=secrets.token_hex(32), created=now)
        self.keys.append(key)
        return key


class KeyRing:
    """What the controller verifies against: the key table (re-read when the file changes) and optionally a shared
    secret. lookup(key_id) -> (node the key belongs to or None for the shared secret, secret) or None."""

    RELOAD_CHECK_S = 1.0

    def __init__(self, table_path: str | Path | None = None, shared_secret: bytes | None = None):
        self.table_path = Path(table_path) if table_path else None
        self.shared_secret = shared_secret
        self._by_id: dict[str, Key] = {}
        self._stamp = None
        self._checked = 0.0
        self._lock = threading.Lock()
        self.reload_error = ""
        if self.table_path is not None:
            self._load()  # a broken table at start is an error, not an empty ring

    @property
    def shared(self) -> bool:
        return self.shared_secret is not None

    def lookup(self, key_id: str | None, now: float | None = None) -> tuple[str | None, bytes] | None:
        if key_id is None:
            return (None, self.shared_secret) if self.shared_secret is not None else None
        self._maybe_reload()
        key = self._by_id.get(key_id)
        if key is None or not key.active(time.time() if now is None else now):
            return None
        return key.node, key.secret.encode()

    def owner(self, key_id: str) -> Key | None:
        """The key with this id even when expired (to say why it was refused)."""
        return self._by_id.get(key_id)

    def nodes(self) -> set[str]:
        return {k.node for k in self._by_id.values()}

    def _maybe_reload(self) -> None:
        if self.table_path is None:
            return
        now = time.monotonic()
        if now - self._checked < self.RELOAD_CHECK_S:
            return
        with self._lock:
            if now - self._checked < self.RELOAD_CHECK_S:
                return
            self._checked = now
            try:
                st = self.table_path.stat()
            except OSError:
                return
            if (st.st_mtime_ns, st.st_size, st.st_ino) != self._stamp:
                try:
                    self._load()
                    self.reload_error = ""
                    log.info("key table %s reloaded: %d keys", self.table_path, len(self._by_id))
                except KeyFileError as exc:  # keep the keys we have; the admin sees the error in the log
                    self.reload_error = str(exc)
                    self._stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
                    log.error("key table not reloaded, keeping the %d keys loaded before: %s", len(self._by_id), exc)

    def _load(self) -> None:
        st = self.table_path.stat() if self.table_path.exists() else None
        table = KeyTable(self.table_path).load()
        self._by_id = {k.id: k for k in table.keys}
        self._stamp = (st.st_mtime_ns, st.st_size, st.st_ino) if st else None
