"""What the store keeps in Redis: a lease's keys, the Lua scripts that change them, and the
records their replies and published messages decode to."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sidecar.backends import records
from sidecar.backends.base import LeaseRecord
from sidecar.backends.records import MAX_TERM, check_term

MAX_VERSION_BYTES = 64  # a version longer than this is named by its digest

KEY_PREFIX = "leader-sidecar"


def lease_keys(lease: str) -> tuple[str, str, str]:
    """(holder key, term key, event channel) of a lease."""
    base = f"{KEY_PREFIX}:{{{lease}}}"
    return f"{base}:holder", f"{base}:term", f"{base}:events"


def candidates_key(group: str) -> str:
    """The hash of a candidate group: one field per identity. Under ``candidates:``, so no
    group name can ever name a lease's keys; the ``{GROUP}`` hash tag, like a lease's, keeps
    everything about one name in one cluster slot."""
    return f"{KEY_PREFIX}:candidates:{{{group}}}"


def candidates_channel(group: str) -> str:
    """Where the group's changes are published (joins, leaves, a new leaving mark)."""
    return f"{candidates_key(group)}:events"


# -- the scripts: one per ownership-dependent step (rule 1) -----------------------------------
# Every script answers the same shape, so one function turns any reply into a record:
#   {granted (1|0), holder value (JSON string) | nil, term counter | nil}
# A Lua `false` inside a table reaches the client as nil. Terms are Lua numbers (doubles):
# exact up to 2^53 grants, and cjson writes them exactly up to 10^14.
#
# The holder value is JSON {holder, term, duration_ms, version, acquired_at, renewed_at},
# or {holder: null, term, released: true, version, successor?} after a release. Its PX TTL
# is garbage collection only (`gc_ms`, many leases long): expiry is observed by the followers
# (rule 2), never read from the TTL, so a step of the Redis host's clock cannot grant the
# lease. A key that vanished anyway (the clock stepped past its TTL, a restart without
# persistence) is not "free": with a counter left it reads as a record with no holder, not
# released, of version "absent.<counter>", which followers wait out like any other; the
# holder puts it back.
# `version` is a random token from the client, new on every write.
#
# What anyone may have written into our keys (a hand edit, a restore, a foreign client) is
# read without failing: `decoded` is nil for a value that is not a JSON object with a term
# and holder as a grant writes them (`sidecar.backends.records` decides the rest: what
# `decoded` refuses, it refuses too) — nobody renews, releases, hands over or puts back over
# such a value — `term_of` is 0
# for anything that is not a term a grant could have written (so a grant counts up from the
# counter and the caller's floor instead), and `version_of` names exactly what is stored —
# the record's own version, else a digest of the stored text — so that a record that cannot
# be read is still taken over conditionally, on that version (`value_record` computes the
# same in Python). A new term past MAX_TERM is never written: the script answers 2.
_HELPERS = (
    f"""
local MAX_TERM = {MAX_TERM}
local MAX_VERSION = {MAX_VERSION_BYTES}
"""
    + """
local function text_ok(value)
  return value == nil or (type(value) == 'string' and #value <= 1024
                          and not string.find(value, '%c'))
end
local function json_of(value)
  if not value then return nil end
  local ok, data = pcall(cjson.decode, value)
  if ok and type(data) == 'table' then return data end
  return nil
end
local function decoded(value)
  local data = json_of(value)
  if not data then return nil end
  local term = tonumber(data.term)
  if not (term and term >= 0 and term <= MAX_TERM and term == math.floor(term)) then return nil end
  if not (text_ok(data.holder) and text_ok(data.successor) and text_ok(data.handed)) then
    return nil
  end
  return data
end
local function term_of(value)
  local n = tonumber(value)
  if n and n >= 0 and n <= MAX_TERM and n == math.floor(n) then return n end
  return 0
end
local function version_of(current, counter)
  if current then
    local data = json_of(current)
    local v = data and data.version
    if (type(v) == 'string' and #v <= MAX_VERSION) or type(v) == 'number' then
      return tostring(v)
    end
    return 'raw.' .. redis.sha1hex(current)
  end
  if counter then
    if #counter <= 32 then return 'absent.' .. counter end
    return 'absent.raw.' .. redis.sha1hex(counter)
  end
  return ''
end
"""
)

# Acquire.
# KEYS[1] holder key, KEYS[2] term counter.
# ARGV[1] identity, ARGV[2] lease in ms, ARGV[3] min_term (the caller's floor), ARGV[4] wall
# time (for humans), ARGV[5] event channel, ARGV[6] the version the caller expects ('' for
# nothing stored at all), ARGV[7] the new version, ARGV[8] the key's GC TTL in ms.
# Grants only when the store holds exactly the expected version; the new term is
# max(counter, held term, min_term) + 1, and the counter is raised to it, so no later grant can
# reuse a term. Publishes the new value.
# Returns {1, new value, term}, {2, current value | nil, counter | nil} when the term would
# pass MAX_TERM, or {0, current value | nil, counter | nil}.
ACQUIRE = (
    _HELPERS
    + """
local current = redis.call('GET', KEYS[1])
local counter = redis.call('GET', KEYS[2])
if version_of(current, counter) ~= ARGV[6] then
  return {0, current, counter}
end
local term = term_of(counter)
local held = decoded(current)
if held and term_of(held.term) > term then term = term_of(held.term) end
if tonumber(ARGV[3]) > term then term = tonumber(ARGV[3]) end
term = term + 1
if term > MAX_TERM then
  return {2, current, counter}
end
local counted = string.format('%d', term)
redis.call('SET', KEYS[2], counted)
local value = cjson.encode({holder = ARGV[1], term = term, duration_ms = tonumber(ARGV[2]),
                            version = ARGV[7], acquired_at = ARGV[4], renewed_at = ARGV[4]})
redis.call('SET', KEYS[1], value, 'PX', ARGV[8])
redis.call('PUBLISH', ARGV[5], value)
return {1, value, counted}
"""
)

# Renew (or put back), as a function both renewal scripts call: one lease, its holder key
# `hkey` and term counter `tkey`; the caller's identity, term, lease in ms, wall time, event
# channel, the new version and the key's GC TTL in ms.
# Renews while the key holds this identity AND this term. If the key is gone, or holds an
# older term, and the counter shows no later grant, the store lost our grant: put it back and
# raise the counter to it. Anything else (a later grant, a release) changes nothing.
# Publishes every write, so followers see each new version at once.
# Returns {1, new value, counter} or {0, current value | false, counter | false}.
# A value that cannot be read is nobody's to renew or put back: it changes nothing.
_RENEW_ONE = (
    _HELPERS
    + """
local function renew_one(hkey, tkey, identity, term, duration_ms, wall, channel, version, gc_ms)
  local current = redis.call('GET', hkey)
  local counter = redis.call('GET', tkey)
  local value
  if current then
    local held = decoded(current)
    local held_term = held and tonumber(held.term)
    if not held_term then
      return {0, current, counter}
    end
    if held.holder == identity and held_term == term then
      held.term = term
      held.duration_ms = duration_ms
      held.renewed_at = wall
      held.version = version
      held.handed = nil
      held.released = nil
      value = cjson.encode(held)
    elseif held_term >= term then
      return {0, current, counter}
    end
  end
  if not value then
    if term_of(counter) > term then
      return {0, current, counter}
    end
    counter = string.format('%d', term)
    redis.call('SET', tkey, counter)
    value = cjson.encode({holder = identity, term = term, duration_ms = duration_ms,
                          version = version, acquired_at = wall, renewed_at = wall,
                          restored = true})
  end
  redis.call('SET', hkey, value, 'PX', gc_ms)
  redis.call('PUBLISH', channel, value)
  return {1, value, counter}
end
"""
)

# Renew one lease.
# KEYS[1] holder key, KEYS[2] term counter.
# ARGV[1] identity, ARGV[2] term, ARGV[3] lease in ms, ARGV[4] wall time, ARGV[5] event
# channel, ARGV[6] the new version, ARGV[7] the key's GC TTL in ms.
# Returns what `renew_one` returns.
RENEW = (
    _RENEW_ONE
    + """
return renew_one(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4],
                 ARGV[5], ARGV[6], ARGV[7])
"""
)

# Renew many leases in one script (`RenewsMany`): lease i (from 0) has KEYS[2i+1] (holder
# key) and KEYS[2i+2] (term counter), and ARGV[6i+3 .. 6i+8]: identity, term, lease in ms,
# event channel, the new version, the key's GC TTL in ms. ARGV[1] wall time, ARGV[2] the number
# of leases. Each lease exactly as RENEW, independently: one whose value cannot be decoded
# answers {-1, the error, false} and the others go on (its own writes come after the decode,
# so it wrote nothing).
# Returns every lease's three fields, flat and in order.
RENEW_MANY = (
    _RENEW_ONE
    + """
local replies = {}
for i = 0, tonumber(ARGV[2]) - 1 do
  local a = 6 * i + 2
  local ok, reply = pcall(renew_one, KEYS[2 * i + 1], KEYS[2 * i + 2], ARGV[a + 1],
                          tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), ARGV[1], ARGV[a + 4],
                          ARGV[a + 5], ARGV[a + 6])
  if not ok then reply = {-1, tostring(reply), false} end
  replies[3 * i + 1] = reply[1]
  replies[3 * i + 2] = reply[2]
  replies[3 * i + 3] = reply[3]
end
return replies
"""
)

# Hand over: a release that grants the lease to the successor in the same write.
# KEYS[1] holder key, KEYS[2] term counter.
# ARGV[1] identity, ARGV[2] term, ARGV[3] the successor, ARGV[4] lease in ms, ARGV[5] min_term
# (the releasing holder's floor), ARGV[6] wall time, ARGV[7] event channel, ARGV[8] the new
# version, ARGV[9] the key's GC TTL in ms, ARGV[10] the successor's candidate version the
# holder chose it by (`handed`; the successor's first renewal clears it).
# Only while the key holds this identity AND this term; the new term is max(counter, held
# term, min_term) + 1, as in a grant. Publishes the new value: the successor leads on it.
# Returns {1, new value, term} or {0, current value | nil, counter | nil}.
HAND_OVER = (
    _HELPERS
    + """
local current = redis.call('GET', KEYS[1])
local counter = redis.call('GET', KEYS[2])
local held = decoded(current)
if held and held.holder == ARGV[1] and tonumber(held.term) == tonumber(ARGV[2]) then
  local term = term_of(counter)
  if term_of(held.term) > term then term = term_of(held.term) end
  if tonumber(ARGV[5]) > term then term = tonumber(ARGV[5]) end
  term = term + 1
  if term > MAX_TERM then
    return {2, current, counter}
  end
  local counted = string.format('%d', term)
  redis.call('SET', KEYS[2], counted)
  local value = cjson.encode({holder = ARGV[3], term = term, duration_ms = tonumber(ARGV[4]),
                              version = ARGV[8], acquired_at = ARGV[6], renewed_at = ARGV[6],
                              handed = ARGV[10]})
  redis.call('SET', KEYS[1], value, 'PX', ARGV[9])
  redis.call('PUBLISH', ARGV[7], value)
  return {1, value, counted}
end
return {0, current, counter}
"""
)

# Release.
# KEYS[1] holder key, KEYS[2] term counter.
# ARGV[1] identity, ARGV[2] term, ARGV[3] event channel, ARGV[4] '1' to publish, '0' not to,
# ARGV[5] the new version, ARGV[6] the key's GC TTL in ms, ARGV[7] the successor the holder
# hands the lease to ('' for none).
# Only while the key holds this identity AND this term: replaces it with a released record
# (the term stays, here and in the counter), so followers may take it at once. The successor
# rides on the released record only (a preference; the record is free for anyone); every
# grant writes a fresh value without it, which clears it.
# Returns {1, released value, counter} or {0, current value | nil, counter | nil}.
RELEASE = (
    _HELPERS
    + """
local current = redis.call('GET', KEYS[1])
local counter = redis.call('GET', KEYS[2])
local held = decoded(current)
if held then
  if held.holder == ARGV[1] and tonumber(held.term) == tonumber(ARGV[2]) then
    local successor = nil
    if ARGV[7] ~= '' then successor = ARGV[7] end
    local value = cjson.encode({term = tonumber(ARGV[2]), released = true, version = ARGV[5],
                                duration_ms = tonumber(held.duration_ms),
                                successor = successor})
    redis.call('SET', KEYS[1], value, 'PX', ARGV[6])
    if ARGV[4] == '1' then
      redis.call('PUBLISH', ARGV[3], value)
    end
    return {1, value, counter}
  end
end
return {0, current, counter}
"""
)

# Mark a loss (a follower saw the store hold nothing, or a grant or a release of a lower term,
# where it had shown a term).
# KEYS[1] holder key, KEYS[2] term counter. ARGV[1] the term seen, ARGV[2] event channel,
# ARGV[3] the holder of an operator's hold.
# Only while there is no holder key, or one holding a grant (no hold) or a release below the
# term, and the counter is below the term: deletes that record, raises the counter to the
# term, which is the marker — the "absent.<counter>" record above — and publishes it.
# Returns {1, nil, counter} or {0, current value | nil, counter | nil}.
MARK_LOST = (
    _HELPERS
    + """
local function is_hold(holder)
  return type(holder) == 'string'
         and (holder == ARGV[3] or string.sub(holder, 1, #ARGV[3] + 1) == ARGV[3] .. ' ')
end
local current = redis.call('GET', KEYS[1])
local counter = redis.call('GET', KEYS[2])
local seen = tonumber(ARGV[1])
if current then
  local held = decoded(current)
  if not (held and term_of(held.term) < seen and not is_hold(held.holder)) then
    return {0, current, counter}
  end
end
if term_of(counter) >= seen then
  return {0, current, counter}
end
counter = string.format('%d', seen)
if current then redis.call('DEL', KEYS[1]) end
redis.call('SET', KEYS[2], counter)
redis.call('PUBLISH', ARGV[2], cjson.encode({lost = true, term = tonumber(counter)}))
return {1, false, counter}
"""
)

# Read.
# KEYS[1] holder key, KEYS[2] term counter. No ARGV.
# Returns {0, value | nil, counter | nil}: both from one moment.
# (No `#!lua flags=no-writes` shebang: it needs Redis 7, and the scripts otherwise run on
# any Redis since 3.0 — managed services still run 6.x. We only ever talk to the primary.)
READ = """
return {0, redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}
"""

# Read many (the watches' reads, `reads.WatchReads`): READ for each lease, in one request.
# KEYS a (holder key, term counter) pair per lease. No ARGV.
# Returns READ's reply for each lease in turn, flattened ({0, value | nil, counter | nil}),
# or {-1, the error, nil} for a lease whose keys cannot be read (another type in them): that
# lease's read fails as READ would, and every other lease is still answered.
READ_MANY = """
local function read_one(holder_key, term_key)
  return {0, redis.call('GET', holder_key), redis.call('GET', term_key)}
end
local replies = {}
for i = 1, #KEYS - 1, 2 do
  local ok, reply = pcall(read_one, KEYS[i], KEYS[i + 1])
  if not ok then
    if type(reply) == 'table' and reply.err then reply = reply.err end  -- (an error reply)
    reply = {-1, tostring(reply), false}
  end
  replies[#replies + 1] = reply[1]
  replies[#replies + 1] = reply[2]
  replies[#replies + 1] = reply[3]
end
return replies
"""


# Beat (a candidate's heartbeat), with the group's garbage collection.
# KEYS[1] the group's hash. ARGV[1] identity, ARGV[2] its record (JSON with `gc_at_ms`: the
# writer's wall time in ms after which the record is garbage), ARGV[3] the writer's wall time
# in ms now.
# Writes the record, drops every record whose `gc_at_ms` has passed by the writer's clock, and
# keeps the hash (PEXPIRE) as long as its longest-lived record. Wall clocks here are garbage
# collection only, as for the holder key: readers judge liveness by watching versions (rule
# 2); a skewed clock can at worst drop a live record until its next beat. Values that are not
# ours are left alone (the hash's own TTL still collects them).
# Publishes the identity on ARGV[4], the group's channel, when the record is new or changes what
# a hand-over chooses by (revision, priority, leaving): a leader following the group reads it
# again then, and need not read it before handing a lease over. A record that is not ours
# counts as new.
# Returns the number of records dropped (`BEAT`), or the hash as it is after the beat
# (`BEAT_AND_LIST`: HGETALL's reply, one beat and one read in one request).
_BEAT = """
local now = tonumber(ARGV[3])
local function decoded(value)
  local ok, record = pcall(cjson.decode, value or '')
  if ok and type(record) == 'table' then return record end
  return nil
end
local function chosen_by(record)
  return tostring(record.revision) .. '|' .. tostring(record.priority) .. '|' ..
    tostring(record.leaving)
end
local fields = redis.call('HGETALL', KEYS[1])
local mine = decoded(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local before, last, dropped = nil, tonumber(mine and mine.gc_at_ms) or 0, 0
for i = 1, #fields, 2 do
  local record = decoded(fields[i + 1])
  if fields[i] == ARGV[1] then
    before = record
  else
    local gc_at = record and tonumber(record.gc_at_ms) or nil
    if gc_at and gc_at <= now then
      redis.call('HDEL', KEYS[1], fields[i])
      dropped = dropped + 1
    elseif gc_at and gc_at > last then
      last = gc_at
    end
  end
end
if before == nil or mine == nil or chosen_by(before) ~= chosen_by(mine) then
  redis.call('PUBLISH', ARGV[4], ARGV[1])
end
if last > now then
  redis.call('PEXPIRE', KEYS[1], string.format('%d', last - now))
end
"""
BEAT = _BEAT + "return dropped\n"
BEAT_AND_LIST = _BEAT + "return redis.call('HGETALL', KEYS[1])\n"


# A candidate's graceful exit. KEYS[1] the group's hash. ARGV[1] identity, ARGV[2] the group's
# channel, told when a record went. Returns the number of records removed.
LEAVE = """
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
if removed > 0 then
  redis.call('PUBLISH', ARGV[2], ARGV[1])
end
return removed
"""


# -- records ----------------------------------------------------------------------------------
# Every value is checked (`sidecar.backends.records`); one that cannot be read is a record of
# unknown holder, with the version `version_of` gives it in the scripts.


def reply_record(reply: list[Any]) -> LeaseRecord | None:
    """The record in any script's reply (the shape above)."""
    _granted, value, counter = reply
    if value is not None:
        return value_record(value)
    if counter is None:
        return None
    # The counter without a holder key: the store lost the holder (see above). Not free.
    return absent_record(counter)


def absent_record(counter: object) -> LeaseRecord:
    """A term counter without its holder key: a loss marker (`LeaseRecord.forgotten`)."""
    text = str(counter)
    raw = _raw(text)
    version = f"absent.{text}" if len(raw) <= 32 else "absent.raw." + _sha1(raw)
    term: object = int(text) if text.isascii() and text.isdigit() and len(text) < 20 else text
    return records.lease_record(holder=None, term=term, duration=0.0, version=version)


def granted(reply: list[Any]) -> bool:
    if int(reply[0]) == 2:  # the next term would pass MAX_TERM
        check_term(MAX_TERM + 1, MAX_TERM, "redis")
    return int(reply[0]) == 1


def value_record(payload: str) -> LeaseRecord:
    """A holder key's value, from a reply or a published message, checked."""
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        data = None
    version = _version_of(payload, data)
    if not isinstance(data, dict):
        return records.unreadable_lease(version, f"not a JSON object ({records.shown(payload)})")
    if data.get("lost") is True:  # published by MARK_LOST: the counter without a holder key
        return absent_record(data.get("term"))
    released = data.get("released", False)
    duration = data.get("duration_ms", 0)
    if type(duration) in (int, float):
        duration = duration / 1000
    return records.lease_record(
        holder=None if released is True else data.get("holder"),
        term=data.get("term"),
        duration=duration,
        version=version,
        released=released,
        successor=data.get("successor") if released is True else None,
        handed=None if released is True else data.get("handed"),
        acquired_at=data.get("acquired_at"),
        renewed_at=data.get("renewed_at"),
        max_term=MAX_TERM,
    )


def _version_of(payload: str, data: object) -> str:
    """The version as the scripts' ``version_of`` gives it, so both sides compare equal:
    the record's own (a number as Lua's ``tostring`` writes it), else a digest of the value."""
    version = data.get("version") if isinstance(data, dict) else None
    if isinstance(version, str) and len(_raw(version)) <= MAX_VERSION_BYTES:
        return version
    if isinstance(version, int | float) and not isinstance(version, bool):
        return "%.14g" % version  # noqa: UP031 (Lua's number format, exactly)
    return "raw." + _sha1(_raw(payload))


def _raw(text: str) -> bytes:
    """The bytes Redis holds (text arrives decoded with ``surrogateescape``)."""
    return text.encode("utf-8", "surrogateescape")


def _sha1(raw: bytes) -> str:
    return hashlib.sha1(raw, usedforsecurity=False).hexdigest()
