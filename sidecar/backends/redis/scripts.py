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
#   {granted (1|0), holder value (JSON string) | nil, term counter | nil}
# A Lua `false` inside a table reaches the client as nil. Terms are Lua numbers (doubles):
# exact up to 2^53 grants, and cjson writes them exactly up to 10^14.
#
# The holder value is JSON {holder, term, duration_ms, version, acquired_at, renewed_at},
# or {holder: null, term, released: true, version} after a release. Its PX TTL is garbage
# collection only (`gc_ms`, many leases long): expiry is observed by the followers (rule 2),
# never read from the TTL, so a step of the Redis host's clock cannot grant the lease. A key
# that vanished anyway (the clock stepped past its TTL, a restart without persistence) is not
# "free": with a counter left it reads as a record with no holder, not released, of version
# "absent.<counter>", which followers wait out like any other; the holder puts it back.
# `version` is a random token from the client, new on every write.
#
# The version of what the store holds, as the scripts compare it:
_VERSION_OF = """
local function version_of(current, counter)
  if current then return tostring(cjson.decode(current).version) end
  if counter then return 'absent.' .. counter end
  return ''
end
"""

# Acquire.
# KEYS[1] holder key, KEYS[2] term counter.
# ARGV[1] identity, ARGV[2] lease in ms, ARGV[3] min_term (the caller's floor), ARGV[4] wall
# time (for humans), ARGV[5] event channel, ARGV[6] the version the caller expects ('' for
# nothing stored at all), ARGV[7] the new version, ARGV[8] the key's GC TTL in ms.
# Grants only when the store holds exactly the expected version; the new term is
# max(counter, held term, min_term) + 1, and the counter is raised to it, so no later grant can
# reuse a term. Publishes the new value.
# Returns {1, new value, term} or {0, current value | nil, counter | nil}.
ACQUIRE = (
    _VERSION_OF
    + """
local current = redis.call('GET', KEYS[1])
local counter = redis.call('GET', KEYS[2])
if version_of(current, counter) ~= ARGV[6] then
  return {0, current, counter}
end
local term = tonumber(counter or '0')
if current then
  local held = cjson.decode(current)
  if held.term > term then term = held.term end
end
if tonumber(ARGV[3]) > term then term = tonumber(ARGV[3]) end
term = term + 1
local counted = string.format('%d', term)
redis.call('SET', KEYS[2], counted)
local value = cjson.encode({holder = ARGV[1], term = term, duration_ms = tonumber(ARGV[2]),
                            version = ARGV[7], acquired_at = ARGV[4], renewed_at = ARGV[4]})
redis.call('SET', KEYS[1], value, 'PX', ARGV[8])
redis.call('PUBLISH', ARGV[5], value)
return {1, value, counted}
"""
)

# Renew (or put back).
# KEYS[1] holder key, KEYS[2] term counter.
# ARGV[1] identity, ARGV[2] term, ARGV[3] lease in ms, ARGV[4] wall time, ARGV[5] event
# channel, ARGV[6] the new version, ARGV[7] the key's GC TTL in ms.
# Renews while the key holds this identity AND this term. If the key is gone, or holds an
# older term, and the counter shows no later grant, the store lost our grant: put it back and
# raise the counter to it. Anything else (a later grant, a release) changes nothing.
# Publishes every write, so followers see each new version at once.
# Returns {1, new value, counter} or {0, current value | nil, counter | nil}.
RENEW = """
local current = redis.call('GET', KEYS[1])
local counter = redis.call('GET', KEYS[2])
local term = tonumber(ARGV[2])
local value
if current then
  local held = cjson.decode(current)
  if held.holder == ARGV[1] and held.term == term then
    held.duration_ms = tonumber(ARGV[3])
    held.renewed_at = ARGV[4]
    held.version = ARGV[6]
    value = cjson.encode(held)
  elseif held.term >= term then
    return {0, current, counter}
  end
end
if not value then
  if tonumber(counter or '0') > term then
    return {0, current, counter}
  end
  counter = string.format('%d', term)
  redis.call('SET', KEYS[2], counter)
  value = cjson.encode({holder = ARGV[1], term = term, duration_ms = tonumber(ARGV[3]),
                        version = ARGV[6], acquired_at = ARGV[4], renewed_at = ARGV[4],
                        restored = true})
end
redis.call('SET', KEYS[1], value, 'PX', ARGV[7])
redis.call('PUBLISH', ARGV[5], value)
return {1, value, counter}
"""

# Release.
# KEYS[1] holder key, KEYS[2] term counter.
# ARGV[1] identity, ARGV[2] term, ARGV[3] event channel, ARGV[4] '1' to publish, '0' not to,
# ARGV[5] the new version, ARGV[6] the key's GC TTL in ms.
# Only while the key holds this identity AND this term: replaces it with a released record
# (the term stays, here and in the counter), so followers may take it at once.
# Returns {1, released value, counter} or {0, current value | nil, counter | nil}.
RELEASE = """
local current = redis.call('GET', KEYS[1])
local counter = redis.call('GET', KEYS[2])
if current then
  local held = cjson.decode(current)
  if held.holder == ARGV[1] and held.term == tonumber(ARGV[2]) then
    local value = cjson.encode({term = held.term, released = true, version = ARGV[5],
                                duration_ms = held.duration_ms})
    redis.call('SET', KEYS[1], value, 'PX', ARGV[6])
    if ARGV[4] == '1' then
      redis.call('PUBLISH', ARGV[3], value)
    end
    return {1, value, counter}
  end
end
return {0, current, counter}
"""

# Read.
# KEYS[1] holder key, KEYS[2] term counter. No ARGV.
# Returns {0, value | nil, counter | nil}: both from one moment.
# (No `#!lua flags=no-writes` shebang: it needs Redis 7, and the scripts otherwise run on
# any Redis since 3.0 — managed services still run 6.x. We only ever talk to the primary.)
READ = """
return {0, redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}
"""


# -- records ----------------------------------------------------------------------------------


def reply_record(reply: list[Any]) -> LeaseRecord | None:
    """The record in any script's reply (the shape above)."""
    _granted, value, counter = reply
    if value is not None:
        return value_record(value)
    if counter is None:
        return None
    # The counter without a holder key: the store lost the holder (see above). Not free.
    term = int(counter)
    return LeaseRecord(holder=None, term=term, duration=0.0, version=f"absent.{counter}")


def granted(reply: list[Any]) -> bool:
    return int(reply[0]) == 1


def value_record(payload: str) -> LeaseRecord:
    """A holder key's value, from a reply or a published message."""
    data = json.loads(payload)
    released = bool(data.get("released"))
    holder = data.get("holder")
    return LeaseRecord(
        holder=None if released or holder is None else str(holder),
        term=int(data["term"]),
        duration=float(data.get("duration_ms") or 0) / 1000,
        version=_lua_tostring(data.get("version")),
        released=released,
        acquired_at=_wall(data.get("acquired_at")),
        renewed_at=_wall(data.get("renewed_at")),
    )


def _lua_tostring(version: object) -> str:
    """The version as the scripts' ``tostring`` writes it, so both sides compare equal."""
    if isinstance(version, float) and version.is_integer():
        return str(int(version))
    return str(version)


def _wall(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
