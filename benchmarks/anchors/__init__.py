"""The anchors the benchmark compares us with, each a tiny script run as its own process.

``k8s_elector``: the official client's elector (``kubernetes.aio.leaderelection``, `LeaseLock`).
``redis_lock``: the heartbeat recipe teams copy (a redis-py asyncio `Lock` renewed every third
of its TTL, followers retrying ``SET NX`` every 100 ms). ``bare_leader``: a bare aiohttp handler
answering fixed bytes, the ceiling for ``/leader`` throughput.

Each prints one JSON line on stdout once it listens (``{"listening": "127.0.0.1:PORT",
"identity": ...}``) and answers ``GET /leader`` the way our sidecar does (``200`` while it
believes it leads, ``503`` otherwise, a JSON body with ``identity`` and ``since``), so one
observer measures us and them alike.
"""
