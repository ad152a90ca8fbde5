"""Which hosts the gateway answers to, and which requests may change something. Pure.

Two rules, each checked before a route runs (`guard.py`):

- **Allowed hosts.** A request's `Host` must be one the gateway was told it is reached
  by (`STREAM_JOBS_GATEWAY_ALLOWED_HOSTS`; by default the address it listens on,
  `localhost`, `127.0.0.1` and `[::1]`, and any IP address when it listens on all of
  them). A page on a name that an attacker's DNS points at 127.0.0.1 (DNS rebinding)
  sends that name as `Host`, so it is refused before it can read or change anything.
- **Same origin for changes.** A request that may change something (any method but GET,
  HEAD and OPTIONS) is refused when the browser says it came from another origin: an
  `Origin` other than the gateway's own (scheme, host and port), `Origin: null`, a
  `Sec-Fetch-Site` other than `same-origin` or `none`, or, without `Origin`, a
  `Referer` from elsewhere. Programs (curl, the client) send none of these headers and
  pass; browsers send `Origin` with every cross-origin POST, so a page on another port
  of the same host, a sibling subdomain or another site cannot post to the gateway,
  with or without its session cookie.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARDS = ("0.0.0.0", "::", "")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def split_host(value: str) -> tuple[str, int | None] | None:
    """`Host` header -> (lower-case host without brackets, port or None); None when it is
    not a host[:port] at all."""
    value = value.strip().lower()
    if not value or any(c in value for c in "/?#@\\ \t"):
        return None
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        if not bracket or not _is_ip(host):
            return None
        port_text = rest[1:] if rest.startswith(":") else None
        if rest and port_text is None:
            return None
    else:
        host, colon, port_text_or_empty = value.partition(":")
        port_text = port_text_or_empty if colon else None
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return host, int(port_text)


@dataclass(frozen=True)
class AllowedHosts:
    """The host names and addresses a gateway answers to (ports are not compared: the
    socket it listens on decides those)."""

    names: frozenset[str]
    any_ip: bool = False

    @classmethod
    def of(cls, configured: str, bind_host: str | None) -> AllowedHosts:
        """From the setting (comma-separated; `*` allows every host) or, when it is empty,
        from the address the gateway listens on."""
        given = [name.strip().lower().strip("[]") for name in configured.split(",")
                 if name.strip()]
        if "*" in given:
            return cls.anything()
        if given:
            return cls(frozenset(given))
        names = {*LOOPBACK_NAMES}
        if bind_host is None:
            return cls(frozenset(names))
        bind = bind_host.strip().lower().strip("[]")
        if bind in _WILDCARDS:
            return cls(frozenset(names), any_ip=True)
        return cls(frozenset({*names, bind}))

    @classmethod
    def anything(cls) -> AllowedHosts:
        return cls(frozenset({"*"}))

    def allows(self, host_header: str | None) -> bool:
        if "*" in self.names:
            return True
        if host_header is None:
            return False
        parts = split_host(host_header)
        if parts is None:
            return False
        host = parts[0]
        return host in self.names or (self.any_ip and _is_ip(host))

    def describe(self) -> str:
        if "*" in self.names:
            return "any host"
        shown = sorted(self.names)
        return ", ".join(shown) + (" and any IP address" if self.any_ip else "")


def origin_of(scheme: str, host_header: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of the gateway as the request reached it."""
    parts = split_host(host_header)
    if parts is None or scheme not in _DEFAULT_PORTS:
        return None
    host, port = parts
    return scheme, host, port if port is not None else _DEFAULT_PORTS[scheme]


def _parse_origin(value: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme]


def cross_origin(method: str, own: tuple[str, str, int] | None,
                 headers: Iterable[tuple[str, str]]) -> str | None:
    """Why a request must not change anything (a sentence), or None when it may: it is a
    safe method, it says nothing of where it came from, or it came from `own`."""
    if method.upper() in SAFE_METHODS:
        return None
    seen = {name.lower(): value for name, value in headers}
    fetch_site = seen.get("sec-fetch-site")
    if fetch_site is not None and fetch_site.strip().lower() not in ("same-origin", "none"):
        return (f"The browser says this request came from a {fetch_site.strip()} page "
                "(Sec-Fetch-Site); the gateway takes changes only from its own pages.")
    origin = seen.get("origin")
    if origin is not None:
        came_from = _parse_origin(origin)
        if came_from is not None and own is not None and came_from != own \
                and came_from[1] == own[1] and came_from[0] != own[0]:
            return (f"The page is {came_from[0]} but the request reached the gateway as "
                    f"{own[0]}: behind a proxy that ends TLS, name it in "
                    "STREAM_JOBS_GATEWAY_TRUSTED_PROXIES so its X-Forwarded-Proto counts.")
        if came_from is None or came_from != own:
            return (f"The request came from the page of another origin ({origin.strip()[:100]}); "
                    "the gateway takes changes only from its own pages.")
        return None
    referer = seen.get("referer")
    if referer is not None and referer.strip() and _parse_origin(referer) != own:
        return ("The request came from the page of another origin (by its Referer); the "
                "gateway takes changes only from its own pages.")
    return None


__all__ = ["LOOPBACK_NAMES", "SAFE_METHODS", "AllowedHosts", "cross_origin", "origin_of",
           "split_host"]
