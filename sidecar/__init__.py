"""leader-sidecar: leader election next to your app.

Replicas' sidecars compete for one lease; at most one answers ``GET /leader`` with 200 at any
moment, together with the *term*: a fencing token that grows with every grant. What it
guarantees, and what it cannot:

* A sidecar stops calling itself leader on its own deadline — the lease minus a safety margin,
  counted from when its last successful renewal was *sent* — even when it cannot reach the store.
* Expiry is judged by the store's own clock (Redis TTL), by this process's observation
  (Kubernetes), or by one host's clock (SQLite); never by comparing two hosts' clocks.
* The term never goes back, even if the store's record is deleted while any sidecar still runs.
* It cannot stop a paused or partitioned app from finishing a write it already started: only
  the resource can, by refusing writes whose term is lower than one it has already seen.
"""
