"""Which parts of a job id are one job (issue 37, item 4).

A job id is only a name: a user on host C who names another user's job (running on hosts A
and B) would have its part merged into that job, its declared figures lowering the job's
intensity, and host C's processes given the job's decisions. So each part carries a claim:

- ``uid:N``: the job is user N's, the uid the agent saw register it (SO_PEERCRED). Enough
  where one uid is one person on every host (a directory service).
- ``key:<digest>``: the launcher gave every rank the same secret (CRUX_JOB_KEY), and
  crux-run sent the agent a digest of it bound to the job id. Needed where uids say nothing
  (pods running as root).

The leader merges the parts that claim alike. Where they differ, the part registered first
(its agent's clock, then the host id) decides the job's claim, and the others are left out,
reported and counted: a squatter cannot take a running job, and a job whose id someone took
first runs unsteered rather than mixed with theirs. A part without a claim (an agent from
before claims) merges with any.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cruxd.control.records import LocalJob

DIGEST_HEX = 32  # 128 bits of SHA-256
KEY_MIN = 16  # bytes of key: a guessable key proves nothing
KEY_MAX = 4096
_CLAIM = re.compile(rf"uid:(0|[1-9][0-9]{{0,9}})|key:[0-9a-f]{{{DIGEST_HEX}}}")


def key_digest(job_id: str, key: bytes) -> str:
    """What crux-run sends for a job key: bound to the job id, so one job's digest says
    nothing about another job under the same key."""
    if not KEY_MIN <= len(key) <= KEY_MAX:
        raise ValueError(f"a job key is {KEY_MIN} to {KEY_MAX} bytes, got {len(key)}")
    h = hashlib.sha256(b"crux job key\0" + job_id.encode() + b"\0" + key)
    return h.hexdigest()[:DIGEST_HEX]


def claim_of(digest: str, uid: int) -> str:
    return f"key:{digest}" if digest else f"uid:{uid}"


def valid_claim(claim: str) -> bool:
    return claim == "" or _CLAIM.fullmatch(claim) is not None


def public(claim: str) -> str:
    """The claim as shown to local clients and people: a key's digest stays with the leader,
    or any member of the agent's group could present it on another host."""
    return "key" if claim.startswith("key:") else claim


@dataclass(frozen=True, slots=True)
class Refused:
    host: str
    reason: str


def split(members: Sequence[tuple[str, LocalJob]]
          ) -> tuple[tuple[tuple[str, LocalJob], ...], tuple[Refused, ...]]:
    """(the parts that are the job, the parts left out) of one job id's (host, part)s."""
    claims = {j.claim for _, j in members} - {""}
    if len(claims) <= 1:
        return tuple(members), ()
    first = min((j.registered_unix_ms, h) for h, j in members if j.claim)
    owner = next(j.claim for h, j in members if (j.registered_unix_ms, h) == first)
    kept = tuple((h, j) for h, j in members if j.claim in ("", owner))
    refused = tuple(Refused(h, f"claims {public(j.claim)}, the job is {public(owner)}'s "
                               f"(registered first, on {first[1]})")
                    for h, j in members if j.claim not in ("", owner))
    return kept, refused
