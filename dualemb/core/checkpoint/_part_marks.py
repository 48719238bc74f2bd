"""Change-tracking marks of a multi-writer save (``_parts.py``): every writer's tables take the
mark of the checkpoint once it is published, so the next delta (full save or delta before it)
holds the rows written since.

A mark is labelled with the SHA-256 of the published manifest. Only the coordinator writes, and
so knows, the manifest; the other writers learn its digest through the job's ``sync`` (one more
round after the commit: the coordinator contributes the digest's 16 16-bit words, everyone else
zeros, so the element-wise sum is the digest; ``sync`` carries non-negative integers below 2**31).
Reading the manifest back from the path instead would race with a later save to the same path.
"""

from __future__ import annotations

from dualemb.core.checkpoint._commit import Sync

_WORDS = 16  # a SHA-256 digest as 16 words of 16 bits


def _words(hex_digest: str) -> list:
    raw = bytes.fromhex(hex_digest)
    if len(raw) != 2 * _WORDS:
        raise ValueError(f"not a SHA-256 hex digest: {hex_digest!r}")
    return [int.from_bytes(raw[2 * i:2 * i + 2], "big") for i in range(_WORDS)]


def share_digest(sync: Sync, digest: str | None) -> str:
    """Every writer calls this after the commit returned; ``digest``: the coordinator's manifest
    digest, None on the other writers. Returns the digest on every writer."""
    words = _words(digest) if digest is not None else [0] * _WORDS
    out = [int(v) for v in sync("dualemb-checkpoint-digest", words)]
    if len(out) != _WORDS or any(not 0 <= v < 1 << 16 for v in out):
        raise ValueError(f"sync('dualemb-checkpoint-digest') returned {out}; expected the "
                         "coordinator's 16 words (did two writers claim to coordinate?)")
    return b"".join(v.to_bytes(2, "big") for v in out).hex()


def begin(tables) -> list:
    """[(table, token)]: starts change tracking's next generation on each table (rows written
    from here on are changed for the save after this one). Tables without tracking are left
    out (a full save of them works; a delta checks for tracking before this)."""
    return [(t, t.changes_begin()) for t in tables if hasattr(t, "changes_begin")]


def commit(tokens: list, digest: str) -> None:
    """Makes each token the table's mark, labelled ``digest`` (the published manifest)."""
    for t, token in tokens:
        if token:
            t.changes_commit(token, digest)
