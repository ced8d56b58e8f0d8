"""The one logging setup of the long-running commands (`edgespec server`, `edgespec client serve`).

Text lines for people, or one JSON object a line for log shippers: time, level, logger, message,
every ``extra=`` field of the record, and the exception. JSON output must stay parseable line by
line, so progress bars (transformers, huggingface_hub, tqdm) are turned off and transformers'
own handler gives way to the root one.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import TextIO

LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged as a field.
_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the record's extra fields, the exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
                 "logger": record.name, "message": record.getMessage()}
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(fmt: str = "text", level: str = "info", stream: TextIO | None = None) -> logging.Handler:
    """Route every logger (uvicorn's and transformers' included) to one stderr handler in `fmt`."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # health probes every few seconds are noise
    if fmt == "json":
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
