"""Digest authentication of INVITEs (RFC 2617/7616, MD5 with ``qop=auth``), sans-IO.

Nonces are stateless: the issue time in milliseconds plus an HMAC of it under a secret made
at start-up, so any nonce we issued in the last ``NONCE_LIFETIME_S`` seconds verifies without
a table of outstanding challenges (a flood of unauthenticated INVITEs costs no memory).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from sip.config import AuthSettings
from sip.header_values import split_list, unquote
from sip.message import Request

NONCE_LIFETIME_S = 300.0
_MAC_HEX_CHARS = 20


class DigestAuth:
    """Challenges (``WWW-Authenticate`` values) and the check of ``Authorization`` headers."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self._secret = secrets.token_bytes(16)

    def challenge(self, now: float) -> str:
        """The ``WWW-Authenticate`` value of a 401; ``now`` in seconds stamps the nonce."""
        stamp = f"{int(now * 1000):x}"
        nonce = f"{stamp}.{self._mac(stamp)}"
        return f'Digest realm="{self.settings.realm}", nonce="{nonce}", algorithm=MD5, qop="auth"'

    def authorized(self, request: Request, now: float) -> bool:
        """Whether the request carries a valid digest for a configured user under a fresh nonce."""
        header = request.headers.get("Authorization") or ""
        scheme, _, rest = header.partition(" ")
        if scheme.lower() != "digest":
            return False
        params: dict[str, str] = {}
        for item in split_list(rest):
            name, _, value = item.partition("=")
            params[name.strip().lower()] = unquote(value)
        password = self.settings.users.get(params.get("username", ""))
        if password is None or params.get("realm") != self.settings.realm:
            return False
        if not self._nonce_fresh(params.get("nonce", ""), now):
            return False
        ha1 = _md5(f"{params['username']}:{params['realm']}:{password}")
        ha2 = _md5(f"{request.method}:{params.get('uri', '')}")
        if params.get("qop"):
            expected = _md5(f"{ha1}:{params['nonce']}:{params.get('nc', '')}:{params.get('cnonce', '')}:auth:{ha2}")
        else:
            expected = _md5(f"{ha1}:{params['nonce']}:{ha2}")
        return hmac.compare_digest(expected, params.get("response", ""))

    def _mac(self, stamp: str) -> str:
        return hmac.new(self._secret, stamp.encode(), hashlib.sha256).hexdigest()[:_MAC_HEX_CHARS]

    def _nonce_fresh(self, nonce: str, now: float) -> bool:
        stamp, _, mac = nonce.partition(".")
        try:
            issued = int(stamp, 16) / 1000
        except ValueError:
            return False
        return hmac.compare_digest(mac, self._mac(stamp)) and 0 <= now - issued <= NONCE_LIFETIME_S


def _md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8")).hexdigest()
