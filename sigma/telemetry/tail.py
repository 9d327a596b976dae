"""Follow a growing file line by line, safely across rotation, truncation, partial lines and restarts.

The position (inode, offset) is persisted with the records read, in the same transaction, so a restart neither
loses nor repeats lines. Rules:
- only complete lines are returned; a partial last line waits until its newline arrives;
- the path now names another inode (rotated by rename): finish the old file through the still-open handle (or, after
  a restart, through the sibling in the same directory with the remembered inode), then start the new one at 0;
- same inode but shorter than the offset, or whose first bytes changed (copytruncate, rewritten in place):
  start again at 0.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_READ_BYTES = 4 * 1024 * 1024  # per call, so one huge file cannot stall a collector run
MAX_LINE_BYTES = 1024 * 1024  # a "line" longer than this without a newline is cut and returned
HEAD_BYTES = 64  # the file's first bytes, remembered to notice a file rewritten in place


class FileTailer:
    def __init__(self, path: str | Path, position: dict | None = None, *, from_end: bool = False):
        self.path = Path(path)
        self.inode: int | None = None
        self.offset = 0
        self._fh = None
        self.head = b""
        self.rotations = 0
        self.truncations = 0
        if position:
            self.inode, self.offset = position.get("inode"), int(position.get("offset", 0))
            self.head = bytes.fromhex(position.get("head", ""))
        elif from_end:
            try:
                st = self.path.stat()
                self.inode, self.offset = st.st_ino, st.st_size
            except OSError:
                pass

    @property
    def position(self) -> dict:
        return {"inode": self.inode, "offset": self.offset, "head": self.head.hex()}

    def close(self) -> None:
        if self._fh:
            self._fh.close()
            self._fh = None

    def read_lines(self) -> list[bytes]:
        """Complete new lines (without the newline), oldest first."""
        lines: list[bytes] = []
        try:
            st = self.path.stat()
        except OSError:
            return lines  # not there (yet, or between rotation and re-creation)
        if self.inode is not None and st.st_ino != self.inode:
            lines += self._finish_rotated()
            self.rotations += 1
            self.close()
            self.inode, self.offset, self.head = st.st_ino, 0, b""
        elif self.inode is not None and (st.st_size < self.offset or not self._same_head()):
            self.truncations += 1
            self.close()
            self.offset = 0
            self.head = b""
        if self.inode is None:
            self.inode = st.st_ino
        if st.st_size > self.offset:
            fh = self._open()
            if fh is not None:
                lines += self._read_from(fh)
        return lines

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
                self.offset += len(data)
                return [data]
            return []
        if final and end + 1 < len(data):  # the rotated file will not grow: its unterminated tail is a line
            self.offset += len(data)
            return data.split(b"\n")
        chunk = data[:end]
        self.offset += end + 1
        return chunk.split(b"\n")
