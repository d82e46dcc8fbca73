"""What every store is built from, once: epoch-tagged versions (`versions`), the log-once
failure report (`guard`), a lease subscription served as an iterator or a callback
(`subscription`), the back-off and reconnect loop (`backoff`), and the candidates' JSON
(`candidate_json`). A store folder imports these; nothing here imports a store."""
