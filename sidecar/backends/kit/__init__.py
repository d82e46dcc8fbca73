"""What every store is built from, once: epoch-tagged versions (`versions`), the log-once
failure report (`guard`), a lease subscription served as an iterator or a callback
(`subscription`), the back-off and reconnect loop (`backoff`), the candidates' JSON
(`candidate_json`), a lease's JSON value (`lease_json`) and one lease kept by a versioned
compare-and-swap (`swap_lease`). A store folder imports these; nothing here imports a store."""
