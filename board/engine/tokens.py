"""The board's secrets as text, and their one hash.

A lease token (minted by board.engine.transitions, or derived for a claim request by
board.engine.claim_requests) and an agent key (board.agent_keys) are shown once and stored only
as `hash_token` of their text: SHA-256, hex. A claim request's (agent, request id) is stored the
same way. One function, so that every stored credential is comparable with every presented one.
"""
from __future__ import annotations

import base64
import hashlib


def hash_token(token: str) -> str:
    """What the database keeps of a token, key or request id: its SHA-256, in hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_text(secret: bytes) -> str:
    """A lease token as the API gives it: `secret` in URL-safe base64 without padding, except
    that it never starts with "-": a token is a command-line argument (`python -m
    taskflow_client complete ID TOKEN`), and one starting with "-" would be read as an option
    (1 token in 64). A leading "-" becomes "_" (the alphabet's other symbol)."""
    text = base64.urlsafe_b64encode(secret).rstrip(b"=").decode()
    return "_" + text[1:] if text.startswith("-") else text
