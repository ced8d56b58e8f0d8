"""The one logging setup of the long-running commands (`edgespec server`, `edgespec client serve`).

Text lines for people, or one JSON object a line for log shippers: time (ISO 8601 with milliseconds and
the zone), level, logger, message, every ``extra=`` field of the record, and the exception. Text lines
show the extra fields too, as ``key=value`` after the message. Python warnings go through logging
(``logging.captureWarnings``), so they are lines of the same format; uvicorn's ``color_message`` (the
message again, with ANSI colour codes) is dropped. Progress bars (transformers, huggingface_hub, tqdm)
are turned off whenever the output is JSON or stderr is not a terminal (a log file, a container's log),
and transformers' own handler gives way to the root one.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime
from typing import TextIO

LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged as a field.
_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
# Fields some libraries add that repeat the message for a terminal: uvicorn's, with ANSI colour codes.
_DROPPED_FIELDS = {"color_message"}


def _extra_fields(record: logging.LogRecord) -> dict:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS and k not in _DROPPED_FIELDS}


class _Timestamps(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """ISO 8601, milliseconds and the local zone's offset: 2026-11-25T11:46:55.123+00:00."""
        return datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")


class JsonFormatter(_Timestamps):
    """One JSON object a line: time, level, logger, message, the record's extra fields, the exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record), "level": record.levelname,
                 "logger": record.name, "message": record.getMessage()}
        for key, value in _extra_fields(record).items():
            entry.setdefault(key, value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(_Timestamps):
    """TEXT_FORMAT, then the record's extra fields as key=value (values with spaces quoted)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        fields = _extra_fields(record)
        if fields:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        return line


def _text_value(value) -> str:
    """A field's value on a text line: control characters escaped (no forged lines or colours), quoted when it
    holds a space, a quote or an equals sign."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(value))
    if not text or any(c.isspace() or c in '"=' for c in text):
        text = '"' + text.replace('"', '\\"') + '"'
    return text


def configure_logging(fmt: str = "text", level: str = "info", stream: TextIO | None = None) -> logging.Handler:
    """Route every logger (uvicorn's, transformers' and Python's warnings included) to one handler in `fmt`."""
    out = stream or sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.captureWarnings(False)  # re-installed even if something replaced warnings.showwarning since
    logging.captureWarnings(True)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "py.warnings"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # health probes every few seconds are noise
    try:
        terminal = bool(out.isatty())
    except (AttributeError, ValueError):  # closed or not a file
        terminal = False
    if fmt == "json" or not terminal:
        quiet_progress_bars()
    return handler


def quiet_progress_bars() -> None:
    """No progress bars, and transformers' warnings through the root handler.

    The variables cover what is imported later (tqdm and huggingface_hub read them when imported);
    the calls cover what is imported already."""
    os.environ["TQDM_DISABLE"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as hf_logging
    except ImportError:  # the CLI runs without them for commands that do not load models
        return
    disable_progress_bars()
    hf_logging.disable_progress_bar()
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
