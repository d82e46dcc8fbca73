"""leader-sidecar: leader election next to your app.

Replicas' sidecars compete for one lease; at most one answers ``GET /leader`` with 200 at any
moment, together with the *term*: a fencing token that grows with every grant. What it
guarantees, and what it cannot:

* A sidecar stops calling itself leader on its own deadline — the lease minus a safety margin,
  counted from when its last successful renewal was *sent* — even when it cannot reach the store.
* Expiry is observed, the same way for every store (`sidecar.observed`): a lease is taken only
  after this process has seen one record version unchanged for a lease on its own monotonic
  clock. No store TTL, timestamp or host clock ever grants.
* Every grant has a term no earlier grant had, also after the store lost its state while any
  sidecar still runs: a holder puts its grant back, and a grant after a loss jumps far above
  every term seen, after waiting out that loss.
* It cannot stop a paused or partitioned app from finishing a write it already started: only
  the resource can, by refusing writes whose term is lower than one it has already seen.
"""

__version__ = "0.1.0"
"""The release (pyproject.toml's version; a test keeps them equal). A constant, not
``importlib.metadata``: reading the installed distributions costs ~10-20 ms of every start."""
