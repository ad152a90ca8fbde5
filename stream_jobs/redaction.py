"""Secrets out of what is shown: URLs, error messages, pages, log lines, CLI output. Pure.

`redact_url(url)` is a URL with every password it can carry replaced by `***`: the
userinfo's (`postgresql://user:pass@host/db`) and the query's `password=` and
`sslpassword=` (any case, the name percent-encoded or not: asyncpg reads both
parameters). `redact_text(text, settings)` does that to every URL inside `text` (an error
message quoting the DSN) and also replaces, wherever it appears, each secret the
settings hold: the database URL's passwords, the gateway token, the Kafka SASL password,
the Kafka TLS key's password, and `PGPASSWORD` from the environment (asyncpg's fallback).

`mask_fields(payload, paths)` is a job's payload as an operator sees it: every field a
path names (a type's TOML `redact = ["card_number", "customer.ssn"]`, dotted paths into
nested objects, through lists of them) replaced by `•••`, whatever it held.

Redaction is for text a person sees; it never decides anything and never raises.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, unquote_plus

import orjson

from stream_jobs.settings import Settings

MASK = "***"
FIELD_MASK = "•••"
# The query parameters that carry a password, compared decoded and in lower case.
PASSWORD_PARAMETERS = frozenset({"password", "sslpassword"})
# asyncpg's fallback for a URL without a password.
PASSWORD_ENV = "PGPASSWORD"

# A URL: a scheme, `//`, and everything up to the next whitespace. Its authority runs to
# the first `/`, `?` or `#`; the userinfo ends at the authority's last `@` (urllib's
# reading; asyncpg's, the first `@`, ends inside it, so both are masked).
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://\S*")
_USERINFO = re.compile(r"(?P<scheme>^[^:]*://)(?P<user>[^/?#:@]*):(?P<password>[^/?#]*)@")
# `name=value` of a query, or of a keyword connection string (`host=h password=p`) in a
# message: the value runs to the next `&`, `#` or whitespace.
_PARAMETER = re.compile(r"(?P<name>[\w%+.-]+)=(?P<value>'(?:[^'\\]|\\.)*'?|[^\s&#]*)")


def redact_url(url: str) -> str:
    """`url` with its passwords replaced by `***`, for errors, logs, tables and pages."""
    return _redact_forms(url)


def redact_text(text: str, settings: Settings | None = None,
                environ: Mapping[str, str] | None = None) -> str:
    """`text` with the passwords of every URL in it, and every secret of `settings` and
    of `environ` (default: the process's) wherever it appears, replaced by `***`."""
    shown = _redact_forms(text)
    # Longest first: a secret that contains another is replaced whole.
    for secret in sorted(secrets_of(settings, environ), key=len, reverse=True):
        shown = _replace(shown, secret)
    return shown


def secrets_of(settings: Settings | None, environ: Mapping[str, str] | None = None
               ) -> set[str]:
    """The secret values `settings` and `environ` hold, as written and as decoded."""
    env = os.environ if environ is None else environ
    found = {env.get(PASSWORD_ENV, "")}
    if settings is not None:
        found |= url_passwords(settings.database_url)
        if settings.database_listen_url is not None:
            found |= url_passwords(settings.database_listen_url)
        for secret in (settings.gateway_token, settings.kafka_sasl_password,
                       settings.kafka_ssl_key_password):
            if secret is not None:
                found.add(secret.get_secret_value())
    found.discard("")
    return found


def url_passwords(url: str) -> set[str]:
    """Every password `url` carries, as written and decoded, read both as urllib and as
    asyncpg read a URL."""
    found: set[str] = set()
    netloc = url.partition("://")[2]
    for end in "/?#":
        netloc = netloc.split(end, 1)[0]
    for userinfo in (netloc.rpartition("@")[0], netloc.partition("@")[0] if "@" in netloc
                     else ""):
        _, colon, password = userinfo.partition(":")
        if colon:
            found |= {password, unquote(password)}
    query = url.partition("?")[2].split("#", 1)[0]
    for name, value in _parameters(query):
        if unquote_plus(name).strip().lower() in PASSWORD_PARAMETERS:
            found |= {value, unquote_plus(value), unquote(value)}
    found.discard("")
    return found


def mask_fields(payload: object, paths: Iterable[str]) -> object:
    """`payload` (decoded JSON) with each field a dotted path names masked as `•••`; a
    list on the way is entered item by item. What no path names is returned as it was
    (a payload that is not an object: entirely); the payload given is not changed."""
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        parts = path.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if child is None:  # a shorter path masks the whole field already
                break
            node = child
        else:
            node[parts[-1]] = None  # None: mask here
    return _masked(payload, tree)


def shown_payload(raw: bytes | None, paths: Sequence[str]) -> str | None:
    """A payload's JSON as an operator sees it: indented, the fields `paths` name masked.
    Bytes that are not JSON are shown as text only when no field is to be masked (what
    to mask in them cannot be told); None when there is no payload."""
    if raw is None:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        if paths:
            return f"({len(raw):,} bytes that are not JSON, not shown: the type masks fields)"
        return raw.decode(errors="replace")
    return orjson.dumps(mask_fields(value, paths), option=orjson.OPT_INDENT_2).decode()


def _masked(value: object, tree: dict[str, Any]) -> object:
    if isinstance(value, list):
        return [_masked(item, tree) for item in value]
    if not isinstance(value, dict) or not tree:
        return value
    shown: dict[object, object] = {}
    for name, field in value.items():
        if name not in tree:
            shown[name] = field
        elif tree[name] is None:
            shown[name] = FIELD_MASK
        else:
            shown[name] = _masked(field, tree[name])
    return shown


def _parameters(query: str) -> Iterable[tuple[str, str]]:
    for part in re.split(r"[&;]", query):
        name, sep, value = part.partition("=")
        if sep:
            yield name, value


def _redact_forms(text: str) -> str:
    """Every URL's userinfo password, then every password parameter, masked."""
    text = _URL.sub(lambda url: _USERINFO.sub(
        lambda m: f"{m['scheme']}{m['user']}:{MASK}@", url.group(), count=1), text)
    return _redact_parameters(text)


def _redact_parameters(text: str) -> str:
    def masked(found: re.Match[str]) -> str:
        if unquote_plus(found["name"]).strip().lower() not in PASSWORD_PARAMETERS:
            return found.group()
        return f"{found['name']}={MASK}"

    return _PARAMETER.sub(masked, text)


def _replace(text: str, secret: str) -> str:
    if secret in MASK:  # "*": the mask itself; replacing it could never finish
        return text
    while secret in text:  # a replacement can join the text around it into the secret
        text = text.replace(secret, MASK)
    return text


__all__ = [
    "FIELD_MASK",
    "MASK",
    "PASSWORD_ENV",
    "PASSWORD_PARAMETERS",
    "mask_fields",
    "redact_text",
    "redact_url",
    "secrets_of",
    "shown_payload",
    "url_passwords",
]
