"""Small file helpers shared by every component."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` so that a reader (status, a relaunch after SIGKILL) never sees a torn file:
    a temporary file in the same folder, then an atomic rename over the target."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def umask_mode(path: str | Path) -> None:
    """Give a file the mode the process's umask gives a new file (0644 under umask 022): for writers that make
    their files private (safetensors writes its weights 0600), so an exported folder reads like the rest."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def check_folder(path: str | Path, key: str, what: str) -> None:
    """Whether the folder `path` (existing or to be made) can hold `what`; raises UserError naming `key` for a file
    in its place or above it, or a nearest existing folder this process cannot write in."""
    from rla_ablate.errors import UserError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{path} is a file, not a folder; {key} names the folder for {what}", key=key)
    above = next((p for p in [path.absolute(), *path.absolute().parents] if p.exists()), None)
    if above is None:
        return
    if not above.is_dir():
        raise UserError(f"{above} is a file, so no folder can be made under it; {key} names the folder for {what}",
                        key=key)
    if not os.access(above, os.W_OK | os.X_OK):
        raise UserError(f"cannot write under {above} (read-only or not yours); {key} names the folder for {what}",
                        key=key)


def make_folder(path: str | Path, key: str, what: str) -> Path:
    """`check_folder`, then make it (and its parents); what the system still refuses (e.g. under /proc) is a
    UserError naming `key` too."""
    from rla_ablate.errors import UserError

    check_folder(path, key, what)
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot make {path}: {e.strerror or e}; {key} names the folder for {what}",
                        key=key) from None
    return path


def shell_arg(value: object) -> str:
    """A path or name as a shell reads it back: a command printed for the user to paste (a root with spaces)."""
    import shlex

    return shlex.quote(str(value))


# Files beside an SQLite database that are part of its state: a rollback journal, a write-ahead log and its index.
SQLITE_COMPANIONS = ("-journal", "-wal", "-shm")


def check_sqlite(path: str | Path, remedy: str = "restore the sweep's tracking store from a copy") -> None:
    """A UserError naming `path` when it is there and is not a readable SQLite database (damaged from outside: not
    SQLite at all, cut short by a copy or a full disk, or its schema unreadable): MLflow would fail on it with a
    long traceback, a launch only after starting Ray. An empty file is an empty database. `remedy`: what the message
    says to do."""
    import sqlite3
    import struct

    from rla_ablate.errors import UserError

    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except FileNotFoundError:
        return
    if not head:
        return
    if not head.startswith(b"SQLite format 3\x00"):
        raise UserError(f"damaged: not an SQLite database; {remedy}", file=str(path))
    if any(Path(f"{path}{end}").exists() for end in SQLITE_COMPANIONS):
        # A write a crash interrupted (its rollback journal) or a write-ahead log: the next read-write open completes
        # or undoes it, which a read-only check cannot; the file alone is not the database's state.
        return
    # The header's page count, valid when its version number matches the change counter (SQLite writes both), times
    # the page size is the file's length; a shorter file was cut short.
    if len(head) == 100:
        page = struct.unpack(">H", head[16:18])[0]
        counter, pages, valid_for = struct.unpack(">III", head[24:36])[0:2] + struct.unpack(">I", head[92:96])
        expected, actual = pages * (65536 if page == 1 else page), os.path.getsize(path)
        if pages and counter == valid_for and actual < expected:
            raise UserError(f"damaged: the file is shorter than its header says ({actual:,} of {expected:,} bytes: a "
                            f"copy cut short, or a full disk); {remedy}", file=str(path))
    con = None
    try:
        con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError:
        return  # busy, locked or not openable here: not damage; MLflow says what it is if it persists
    except sqlite3.DatabaseError as exc:
        raise UserError(f"damaged: SQLite cannot read it ({exc}); {remedy}", file=str(path)) from None
    finally:
        if con is not None:
            con.close()


class LockHeld(Exception):
    """`lock_exclusive`: another live process holds the lock."""


def lock_exclusive(path: str | Path) -> int | None:
    """An exclusive flock on `path` (created if missing), taken without waiting: the open descriptor, which the
    kernel lets go when the process dies (nothing stale to clean up after a kill -9), or None on a file system
    without locks (some network mounts), where the caller goes on unguarded. Raises LockHeld while another process
    holds it, OSError when the file cannot be opened."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LockHeld(str(path)) from None
    except OSError:
        os.close(fd)
        return None
    return fd


def unlock(fd: int | None) -> None:
    """Let go of a `lock_exclusive` lock (None: there was none to take)."""
    import fcntl

    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
