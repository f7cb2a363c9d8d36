"""Which environment variables hold secrets, and hiding their values in anything logged or printed."""

from __future__ import annotations

import os
import re

# credentials of S3, model endpoints and Ray; *_PATH / *_FILE name where a secret is, not the secret
SECRET_NAME = re.compile(r"(SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|SESSION_KEY|PRIVATE)", re.I)
MIN_SECRET_LEN = 6  # shorter values ("true", "1") would blank ordinary text


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name)) and not name.endswith(("_PATH", "_FILE"))


_KEY_NAMES: set[str] = set()  # variables model specs read their keys from (api_key_env=NAME): secrets whatever the name


def register_secret_names(names) -> None:
    """Variables whose values are secrets whatever their names (an openai spec's ``api_key_env``)."""
    _KEY_NAMES.update(str(n) for n in names)


def secret_values() -> list[str]:
    """Values of secret-looking environment variables (and registered key variables), longest first."""
    values = {v for k, v in os.environ.items()
              if (is_secret_name(k) or k in _KEY_NAMES) and len(v) >= MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


# a secret-looking option written inline (``api_key=sk-…`` in --model_args or a model spec's query)
INLINE_SECRET = re.compile(r"(?i)\b([a-z_]*(?:secret|token|password|passwd|credentials?|api_key|access_key|session_key))"
                           r"=([^&,\s'\"]+)")  # the name ends in the secret word: max_new_tokens, api_key_env are not


BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}")  # an Authorization header's value


def redact(text: str, *extra: str | None) -> str:
    """``text`` with the values of secret-looking environment variables (and of ``extra`` secrets: a key the caller
    holds), inline ``key=value`` options and ``Bearer <token>`` values replaced by ``***``."""
    for value in sorted({v for v in extra if v and len(v) >= 4} | set(secret_values()), key=len, reverse=True):
        text = text.replace(value, "***")
    text = BEARER.sub(lambda m: f"{m.group(1)} ***", text)
    return INLINE_SECRET.sub(lambda m: f"{m.group(1)}=***", text)
