"""How to open the Ray dashboard of the cluster this process is connected to.

Ray >= 2.52 can require a token for the dashboard ("Authentication Token Required"); a local
`ray.init()` in Ray 2.60 turns token authentication on by default and keeps the token where
`ray get-auth-token` finds it: `$RAY_AUTH_TOKEN`, else the file `$RAY_AUTH_TOKEN_PATH`, else
`~/.ray/auth_token` (generated on first use). The dashboard's login page takes that token and keeps
it as a cookie; API clients send it as `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_TOKEN_PATH = Path.home() / ".ray" / "auth_token"


def url() -> str | None:
    """The dashboard's address (http://host:port), or None without a dashboard."""
    try:
        import ray

        address = ray._private.worker.get_dashboard_url()  # the one place Ray exposes it
    except Exception:
        return None
    if not address:
        return None
    return address if address.startswith("http") else f"http://{address}"


def token_required() -> bool:
    """True when the connected cluster enforces token authentication."""
    mode = os.environ.get("RAY_AUTH_MODE", "").lower()
    if mode:
        return mode == "token"
    try:
        from ray._private.authentication import authentication_utils

        return bool(authentication_utils.is_token_auth_enabled())
    except Exception:
        return False


def token_source() -> str:
    """Where `ray get-auth-token` reads the token from, in Ray's order of precedence."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "the environment variable RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"the file {os.environ['RAY_AUTH_TOKEN_PATH']} (RAY_AUTH_TOKEN_PATH)"
    return f"the file {DEFAULT_TOKEN_PATH}"


def read_token() -> str | None:
    """The token itself (for tests and tools that talk to the dashboard), if one is readable."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or DEFAULT_TOKEN_PATH)
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def how_to_look(actor_prefix: str) -> list[str]:
    """The lines a sweep prints when it starts: the address, how to get in, what to look for."""
    address = url()
    if address is None:
        return ["Ray dashboard: not running (SEQPAR_RAY_DASHBOARD=0 or a cluster without one)"]
    lines = [f"Ray dashboard: {address}/#/actors  (the ranks are actors named "
             f"{actor_prefix}<rank>)"]
    if token_required():
        lines.append(f"  it asks for a token: paste the output of `ray get-auth-token` "
                     f"(read from {token_source()})")
    return lines
