"""Follow a growing file line by line, safely across rotation, truncation, rewrites, partial lines and restarts.

The position (inode, offset, the first bytes of the file and the bytes just before the offset) is persisted with
the records read, in the same transaction, so a restart neither loses nor repeats lines. Rules:
- only complete lines are returned; a partial last line waits until its newline arrives;
- the path now names another inode (rotated by rename): finish the old file through the still-open handle (or, after
  a restart, through the sibling in the same directory with the remembered inode), then start the new one at 0;
- same inode but shorter than the offset, or whose first bytes or the bytes before the offset changed
  (copytruncate, truncation, a line removed or an editor's save in place): start again at 0.
Whenever a file is started again at 0, everything it holds at that moment may be lines already read (an editor
or `sigma chaos undo` rewrites the whole file): `read()` marks those lines `maybe_seen`, and the caller skips the
ones whose fingerprint it remembers (`remember` / `shipped`, persisted with the position) or whose own time stamp
is older than `guard_ts` (when bytes were last consumed before the restart: such a line was in the file then, read
or skipped as history), so no line is shipped twice while lines written later are never held back.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from pathlib import Path

MAX_READ_BYTES = 4 * 1024 * 1024  # per call, so one huge file cannot stall a collector run
MAX_LINE_BYTES = 1024 * 1024  # a "line" longer than this without a newline is cut and returned
HEAD_BYTES = 64  # the file's first bytes, remembered to notice a file rewritten in place
TAIL_BYTES = 64  # the bytes just before the offset, remembered to notice a line removed or changed before it
MAX_FINGERPRINTS = 2000  # fingerprints of shipped lines remembered per file (the newest)


class FileTailer:
    def __init__(self, path: str | Path, position: dict | None = None, *, from_end: bool = False):
        self.path = Path(path)
        self.inode: int | None = None
        self.offset = 0
        self._fh = None
        self.head = b""
        self.tail = b""
        self.guard = 0  # lines ending at or before this offset may have been read before the last restart at 0
        self.consumed_ts = 0.0  # when bytes were last consumed (or skipped as history)
        self.guard_ts = 0.0  # consumed_ts at the last restart at 0: lines stamped before it were in the file then
        self.shipped: OrderedDict[str, None] = OrderedDict()  # fingerprints of lines the caller shipped
        self.rotations = 0
        self.truncations = 0
        self._seen_size: tuple | None = None  # (size, mtime) when the tail was last checked
        if position:
            self.inode, self.offset = position.get("inode"), int(position.get("offset", 0))
            self.head = bytes.fromhex(position.get("head", ""))
            self.tail = bytes.fromhex(position.get("tail", ""))
            self.guard = int(position.get("guard", 0))
            self.guard_ts = float(position.get("guard_ts", 0.0))
            self.consumed_ts = float(position.get("ts", 0.0))
            self.shipped = OrderedDict.fromkeys(position.get("shipped", []))
        elif from_end:
            try:
                st = self.path.stat()
                self.inode, self.offset = st.st_ino, st.st_size
                self.consumed_ts = time.time()  # what is there now is history
            except OSError:
                pass

    @property
    def position(self) -> dict:
        pos = {"inode": self.inode, "offset": self.offset, "head": self.head.hex(), "tail": self.tail.hex(),
               "ts": self.consumed_ts}
        if self.guard > self.offset:
            pos["guard"], pos["guard_ts"] = self.guard, self.guard_ts
        if self.shipped:
            pos["shipped"] = list(self.shipped)
        return pos

    def remember(self, fingerprint: str) -> None:
        """The caller shipped a line with this fingerprint: never ship it again from a rewritten file."""
        self.shipped[fingerprint] = None
        self.shipped.move_to_end(fingerprint)
        while len(self.shipped) > MAX_FINGERPRINTS:
            self.shipped.popitem(last=False)

    def was_shipped(self, fingerprint: str) -> bool:
        return fingerprint in self.shipped

    def close(self) -> None:
        if self._fh:
            self._fh.close()
            self._fh = None

    def read_lines(self) -> list[bytes]:
        """Complete new lines (without the newline), oldest first."""
        return [line for line, _ in self.read()]

    def read(self) -> list[tuple[bytes, bool]]:
        """Complete new lines (without the newline), oldest first, each with maybe_seen: it was in the file when
        the file was started again at 0, so it may be a line read before."""
        lines: list[tuple[bytes, bool]] = []
        try:
            st = self.path.stat()
        except OSError:
            return lines  # not there (yet, or between rotation and re-creation)
        if self.inode is not None and st.st_ino != self.inode:
            lines += [(line, False) for line in self._finish_rotated()]
            self.rotations += 1
            self.close()
            self._restart(st.st_ino, st.st_size)
        elif self.inode is not None and (st.st_size < self.offset or not self._same_head() or not self._same_tail(st)):
            self.truncations += 1
            self.close()
            self._restart(self.inode, max(st.st_size, self.offset))  # the old content may come back (a restore)
        if self.inode is None:
            self.inode = st.st_ino
        self._seen_size = (st.st_size, st.st_mtime_ns)
        if st.st_size > self.offset:
            fh = self._open()
            if fh is not None:
                start = self.offset
                for line in self._read_from(fh):
                    start += len(line) + 1
                    lines.append((line, start <= self.guard))
        return lines

    def _restart(self, inode: int, guard: int) -> None:
        self.inode, self.offset, self.head, self.tail = inode, 0, b"", b""
        self.guard = guard  # lines up to here may all have been read before (a rewrite, an editor's save)
        self.guard_ts = self.consumed_ts

    def _open(self):
        if self._fh is None:
            try:
                self._fh = open(self.path, "rb")
            except OSError:
                return None
            if os.fstat(self._fh.fileno()).st_ino != self.inode:  # replaced between stat and open
                self._fh.close()
                self._fh = None
                return None
        return self._fh

    def _same_head(self) -> bool:
        if not self.head:
            return True
        fh = self._open()
        if fh is None:
            return True
        fh.seek(0)
        return fh.read(len(self.head)) == self.head

    def _same_tail(self, st) -> bool:
        """The bytes before the offset are still the ones read: no line before it was removed or changed."""
        if not self.tail or self._seen_size == (st.st_size, st.st_mtime_ns):
            return True
        fh = self._open()
        if fh is None:
            return True
        fh.seek(self.offset - len(self.tail))
        return fh.read(len(self.tail)) == self.tail

    def _finish_rotated(self) -> list[bytes]:
        fh = self._fh
        opened_here = False
        if fh is None:  # after a restart: find the rotated file by its inode next to the path
            try:
                for entry in os.scandir(self.path.parent):
                    if entry.is_file(follow_symlinks=False) and entry.inode() == self.inode:
                        fh, opened_here = open(entry.path, "rb"), True
                        break
            except OSError:
                pass
        if fh is None:
            return []
        try:
            if os.fstat(fh.fileno()).st_size < self.offset:
                return []
            return self._read_from(fh, final=True)
        finally:
            if opened_here:
                fh.close()

    def _read_from(self, fh, final: bool = False) -> list[bytes]:
        if not final and len(self.head) < HEAD_BYTES:
            fh.seek(0)
            self.head = fh.read(min(HEAD_BYTES, self.offset + MAX_READ_BYTES))
        fh.seek(self.offset)
        data = fh.read(MAX_READ_BYTES)
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) >= MAX_LINE_BYTES or (final and data):
                self._consumed(data)
                return [data]
            return []
        if final and end + 1 < len(data):  # the rotated file will not grow: its unterminated tail is a line
            self._consumed(data)
            return data.split(b"\n")
        self._consumed(data[:end + 1])
        return data[:end].split(b"\n")

    def _consumed(self, data: bytes) -> None:
        self.offset += len(data)
        self.tail = (self.tail + data)[-TAIL_BYTES:]
        self.consumed_ts = time.time()
