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

A `SQLiteStoreClient` serves every lease of a sidecar (issue 11: up to a thousand) on one
connection, one thread and one change poller (`watch`); `SQLiteLeaseStore` is one lease with a
client of its own. Candidate records live in the same file (`candidates`).
"""

from sidecar.backends.sqlite.client import SQLiteLeaseStore, SQLiteStoreClient


def sqlite_path(url: str) -> str:
    """``sqlite:///./x.db`` → ``./x.db``; ``sqlite:////var/lib/x.db`` → ``/var/lib/x.db``."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ValueError("expected sqlite:///relative/path.db or sqlite:////absolute/path.db")
    return url[len(prefix) :]


__all__ = ["SQLiteLeaseStore", "SQLiteStoreClient", "sqlite_path"]
