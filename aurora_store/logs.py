"""Structured logging: JSON lines when stderr is not a terminal, readable lines when it is.

Every record carries the run, the process and (when known) the policy version, set once per process via
:func:`configure` and updated with :func:`set_version`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_CONTEXT: dict[str, Any] = {"run": None, "process": None, "version": None}
_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class _ContextFilter(logging.Filter):
    """Stamps run, process name and version on every record (as ``aurora_*``: LogRecord owns ``process``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.aurora_run = _CONTEXT["run"]
        record.aurora_process = _CONTEXT["process"]
        if not hasattr(record, "version"):
            record.version = _CONTEXT["version"]
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "run": getattr(record, "aurora_run", _CONTEXT["run"]),
            "process": getattr(record, "aurora_process", _CONTEXT["process"]),
            "pid": record.process,
            "version": getattr(record, "version", _CONTEXT["version"]),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith(("_", "aurora_")) and key not in doc:
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class HumanFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        who = getattr(record, "aurora_process", None) or _CONTEXT["process"]
        version = record.__dict__.get("version")
        extra = {k: v for k, v in record.__dict__.items()
                 if k not in _RESERVED and k not in _CONTEXT and not k.startswith(("_", "aurora_"))}
        tail = " ".join(f"{k}={v}" for k, v in extra.items())
        at = f"@v{version}" if version is not None else ""
        line = f"{stamp} {record.levelname[0]} [{who or record.name}{at}]"
        line += f" {record.getMessage()}" + (f"  {tail}" if tail else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(process: str, run: str | None = None, level: int = logging.INFO, *, json_lines: bool | None = None,
              stream=None) -> None:
    """Install the handler on the root logger (idempotent)."""
    _CONTEXT["process"] = process
    _CONTEXT["run"] = run
    stream = stream or sys.stderr
    use_json = (not stream.isatty()) if json_lines is None else json_lines
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if use_json else HumanFormatter())
    handler.addFilter(_ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_aurora", False):
            root.removeHandler(old)
    handler._aurora = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("botocore", "urllib3", "s3transfer", "filelock", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def set_version(version: int | None) -> None:
    _CONTEXT["version"] = version
