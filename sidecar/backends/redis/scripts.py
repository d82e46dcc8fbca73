"""What the store keeps in Redis: a lease's keys, the Lua scripts that change them, and the
records their replies and published messages decode to."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sidecar.backends.base import LeaseRecord

KEY_PREFIX = "leader-sidecar"


def lease_keys(lease: str) -> tuple[str, str, str]:
    """(holder key, term key, event channel) of a lease."""
    base = f"{KEY_PREFIX}:{{{lease}}}"
    return f"{base}:holder", f"{base}:term", f"{base}:events"


# -- the scripts: one per ownership-dependent step (rule 1) -----------------------------------
# Every script answers the same shape, so one function turns any reply into a record:
#   {granted (1|0), holder value (JSON string) | nil, PTTL of the holder key in ms,
#    term counter | nil}
# A Lua `false` inside a table reaches the client as nil. Terms are Lua numbers (doubles):
# exact up to 2^53 grants, and cjson writes them exactly up to 10^14 — at one grant per second,
# three million years.

# Acquire.
# KEYS[1] holder key, KEYS[2] term counter.
# ARGV[1] identity, ARGV[2] lease in ms, ARGV[3] min_term (the caller's high-water mark),
# ARGV[4] wall time (for humans), ARGV[5] event channel, ARGV[6] '1' after a reset (grant
# even if the store is behind), ARGV[7] '1' if the Sentinels switched master within a lease.
# Grants when the holder key is absent (free, released, or expired by its TTL) or holds the
# caller's identity; the new term is max(INCR counter, min_term + 1, held term + 1), and the
# counter is raised to it, so no later grant can reuse a term. Publishes the new value.
# Refuses without writing when the store is behind: its term below min_term (it lost data:
# a restart without persistence, a failover to a replica that missed writes) or a master
# switch just happened — a holder it no longer shows may still be leading.
# Returns {1, new value, lease ms, term}, {0, current value, PTTL, counter} when held, or
# {2, current value | nil, PTTL, counter} when behind.
ACQUIRE = """
local current = redis.call('GET', KEYS[1])
local floor = tonumber(ARGV[3]) + 1
local stored = tonumber(redis.call('GET', KEYS[2]) or '0')
if current then
  local held = cjson.decode(current)
  if held.holder ~= ARGV[1] then
    return {0, current, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
  end
  if held.term + 1 > floor then floor = held.term + 1 end
  if held.term > stored then stored = held.term end
end
if (stored < tonumber(ARGV[3]) or ARGV[7] == '1') and ARGV[6] ~= '1' then
  return {2, current, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
end
local term = redis.call('INCR', KEYS[2])
if term < floor then
  term = floor
  redis.call('SET', KEYS[2], string.format('%d', term))
end
local value = cjson.encode({holder = ARGV[1], term = term, duration_ms = tonumber(ARGV[2]),
                            version = 1, acquired_at = ARGV[4], renewed_at = ARGV[4]})
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
redis.call('PUBLISH', ARGV[5], value)
return {1, value, tonumber(ARGV[2]), string.format('%d', term)}
"""

# Renew.
# KEYS[1] holder key, KEYS[2] term counter.
# ARGV[1] identity, ARGV[2] term, ARGV[3] lease in ms, ARGV[4] wall time.
# Extends the TTL to one full lease only while the key holds this identity AND this term; an
# expired key is absent, so a lapsed grant cannot be revived (the caller must acquire anew).
# Returns {1, new value, lease ms, counter} or {0, current value | nil, PTTL, counter}.
RENEW = """
local current = redis.call('GET', KEYS[1])
if current then
  local held = cjson.decode(current)
  if held.holder == ARGV[1] and held.term == tonumber(ARGV[2]) then
    held.duration_ms = tonumber(ARGV[3])
    held.renewed_at = ARGV[4]
    held.version = held.version + 1
    local value = cjson.encode(held)
    redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
    return {1, value, tonumber(ARGV[3]), redis.call('GET', KEYS[2])}
  end
end
return {0, current, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
"""

# Release.
# KEYS[1] holder key, KEYS[2] term counter.
# ARGV[1] identity, ARGV[2] term, ARGV[3] event channel, ARGV[4] '1' to publish, '0' not to.
# Compare-and-delete: deletes the holder key only while it holds this identity AND this term;
# the term counter stays. Publishes {"term": T, "released": true} so followers try at once.
# Returns {1, nil, -2, released term} or {0, current value | nil, PTTL, counter}.
RELEASE = """
local current = redis.call('GET', KEYS[1])
if current then
  local held = cjson.decode(current)
  if held.holder == ARGV[1] and held.term == tonumber(ARGV[2]) then
    redis.call('DEL', KEYS[1])
    if ARGV[4] == '1' then
      redis.call('PUBLISH', ARGV[3], cjson.encode({term = held.term, released = true}))
    end
    return {1, false, -2, string.format('%d', held.term)}
  end
end
return {0, current, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
"""

# Read.
# KEYS[1] holder key, KEYS[2] term counter. No ARGV.
# Returns {0, value | nil, PTTL, counter}: value and its TTL from one moment.
# (No `#!lua flags=no-writes` shebang: it needs Redis 7, and the scripts otherwise run on
# any Redis since 3.0 — managed services still run 6.x. We only ever talk to the primary.)
READ = """
return {0, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
"""


# -- records ----------------------------------------------------------------------------------


def reply_record(reply: list[Any]) -> LeaseRecord | None:
    """The record in any script's reply (the shape above)."""
    _granted, value, pttl, counter = reply
    if value is None:
        if counter is None:
            return None
        term = int(counter)
        return LeaseRecord(holder=None, term=term, duration=0.0, expires_in=0.0,
                           version=f"{term}.free")  # fmt: skip
    data = json.loads(value)
    duration = float(data["duration_ms"]) / 1000
    pttl = int(pttl)
    # -1: the key has no TTL, which only someone else's write can cause; count it as held
    # for one more lease rather than as free.
    expires_in = pttl / 1000 if pttl >= 0 else duration if pttl == -1 else 0.0
    return _value_record(data, expires_in)


def granted(reply: list[Any]) -> bool:
    return int(reply[0]) == 1


def message_record(payload: str) -> LeaseRecord:
    """A published grant (the new value: it expires one lease from now) or release."""
    data = json.loads(payload)
    if data.get("released"):
        term = int(data["term"])
        return LeaseRecord(holder=None, term=term, duration=0.0, expires_in=0.0,
                           version=f"{term}.free")  # fmt: skip
    return _value_record(data, float(data["duration_ms"]) / 1000)


def _value_record(data: dict[str, Any], expires_in: float) -> LeaseRecord:
    term = int(data["term"])
    return LeaseRecord(
        holder=str(data["holder"]),
        term=term,
        duration=float(data["duration_ms"]) / 1000,
        expires_in=expires_in,
        version=f"{term}.{int(data['version'])}",
        acquired_at=_wall(data.get("acquired_at")),
        renewed_at=_wall(data.get("renewed_at")),
    )


def _wall(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
