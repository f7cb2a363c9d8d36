"""Which environment variables hold secrets, and hiding their values in anything logged or printed."""

from __future__ import annotations

import os
import re

# credentials of S3, model endpoints and Ray; *_PATH / *_FILE name where a secret is, not the secret
SECRET_NAME = re.compile(r"(SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|SESSION_KEY|PRIVATE)", re.I)
MIN_SECRET_LEN = 6  # shorter values ("true", "1") would blank ordinary text


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name)) and not name.endswith(("_PATH", "_FILE"))


def secret_values() -> list[str]:
    """Values of secret-looking environment variables, longest first."""
    values = {v for k, v in os.environ.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


def redact(text: str) -> str:
    for value in secret_values():
        text = text.replace(value, "***")
    return text
