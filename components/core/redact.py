"""Keep secrets out of logs, MLflow params and tags: credentials in URLs and the values of
secret-looking environment variables are masked wherever text leaves the process (the consoles
and an orchestrator's error states: pipeline.ops.redaction)."""

from __future__ import annotations

import logging
import os
import re

MASK = "***"
# scheme://user:password@host -> scheme://user:***@host, and scheme://TOKEN@host (a token as
# the whole userinfo, as GitHub and some MLflow servers take it) -> scheme://***@host
_URL_USERINFO = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://)(?P<info>[^\s/@?#]+)@", re.I)
# ?access_token=...&X-Amz-Signature=... -> the values masked, the names kept
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&;][\w.-]*(?:token|secret|password|passwd|pwd|key|sig|signature|credential|"
    r"auth)[\w.-]*=)[^&;#\s'\"]+", re.I)
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL", re.I)
_MIN_SECRET = 6  # shorter values ("1", "true") would mask ordinary words


def secret_values() -> list[str]:
    """Values of the environment variables whose names say they are secrets, longest first."""
    values = {v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET}
    return sorted(values, key=len, reverse=True)


def redact(text: str) -> str:
    """`text` with credentials in URLs (userinfo, token-like query values) and secret
    environment values masked."""
    text = _URL_USERINFO.sub(lambda m: m["head"] + _masked_userinfo(m["info"]) + "@", text)
    text = _QUERY_SECRET.sub(lambda m: m["head"] + MASK, text)
    for value in secret_values():
        text = text.replace(value, MASK)
    return text


def _masked_userinfo(info: str) -> str:
    """`user:password` -> `user:***`; a lone `user` may be a token, so -> `***`."""
    user, colon, _ = info.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def install_log_redaction() -> None:
    """Mask secrets in every log record this process creates, whichever handler (console,
    file, Prefect's API) writes it: the message and any traceback are redacted up front."""
    make = logging.getLogRecordFactory()
    if getattr(make, "redacts", False):
        return

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = make(*args, **kwargs)
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    factory.redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
