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
"""

from sidecar.backends.sqlite.lease import SQLiteLeaseStore, sqlite_path

__all__ = ["SQLiteLeaseStore", "sqlite_path"]
