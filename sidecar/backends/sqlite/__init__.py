"""The embedded store: one SQLite file shared by every sidecar on one host.

The store only reports and writes conditionally; expiry is observed by each sidecar on its own
monotonic clock (rule 2, `sidecar.observed`), so neither the host's clocks nor time namespaces
(``unshare --time``, checkpoint/restore) can grant a lease. Every write sets a new random
``version``, which is what the observers compare. ``expires_at``/``boot_id`` are still written
(``CLOCK_BOOTTIME`` + lease, for earlier versions of the sidecar sharing the file during an
upgrade) but never read. Single-host only: never put the file on a network filesystem.

Each mutation is one conditional statement inside one ``BEGIN IMMEDIATE`` transaction, so
concurrent processes serialise on SQLite's write lock and the condition is evaluated under it.
``synchronous=FULL`` because a lost commit after a power cut could rewind the term.

A `SQLiteStoreClient` serves every lease of a sidecar (thousands) on one
connection, one thread and one change poller (`watch`); `SQLiteLeaseStore` is one lease with a
client of its own. Candidate records live in the same file (`candidates`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.backends.lazy import lazy_names

if TYPE_CHECKING:
    from sidecar.backends.sqlite.client import SQLiteLeaseStore, SQLiteStoreClient


__getattr__ = lazy_names(
    __name__,
    {name: "sidecar.backends.sqlite.client" for name in ("SQLiteLeaseStore", "SQLiteStoreClient")},
)


def sqlite_path(url: str) -> str:
    """``sqlite:///./x.db`` → ``./x.db``; ``sqlite:////var/lib/x.db`` → ``/var/lib/x.db``."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ValueError("expected sqlite:///relative/path.db or sqlite:////absolute/path.db")
    return url[len(prefix) :]


# The first 16 bytes of every SQLite database file (https://sqlite.org/fileformat.html).
HEADER = b"SQLite format 3\x00"
# Kernel filesystems: a file there is never a database, and SQLite only ever answers "unable
# to open database file" there, for ever.
KERNEL_FILESYSTEMS = (Path("/proc"), Path("/sys"))


def never_works(path: str) -> str | None:
    """Why the store at ``path`` can never work, whatever is retried — said at start, with
    the flag, rather than as the same error every retry for ever — or None. What may come
    back (a locked file, a full disk) is not judged here: that is retried, with ``/readyz``
    503 and the reason. Reads 16 bytes at most, and only from a regular file."""
    where = Path(path).absolute()
    try:
        resolved = where.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a loop of symbolic links (Python 3.11)
        return f"{where} cannot be resolved (a loop of symbolic links?); pick another path"
    for kernel in KERNEL_FILESYSTEMS:
        if resolved == kernel or kernel in resolved.parents:
            return (
                f"{kernel} is a kernel filesystem, not a place for a database; pick a path on disk"
            )
    if not resolved.exists():
        return None  # a new store: created on first use
    if not resolved.is_file():
        return f"{where} exists and is not a regular file; pick a path for a database file"
    try:
        with resolved.open("rb") as file:
            header = file.read(len(HEADER))
    except OSError as exc:
        return f"{where} cannot be read by this user ({exc.strerror}); fix its permissions"
    if header and header != HEADER:
        return (
            f"{where} is not a SQLite database; point --store at the sidecar's database or at "
            "a path that does not exist yet"
        )
    return None


__all__ = ["SQLiteLeaseStore", "SQLiteStoreClient", "never_works", "sqlite_path"]
