"""What a logger writes during a test, as the portal's JSON formatter renders it (portal/logs.py)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from portal.logs import formatter


@contextmanager
def lines_logged(logger_name: str) -> Iterator[list[dict[str, Any]]]:
    """The lines `logger_name` writes meanwhile, as the portal's JSON formatter renders them (filled on exit)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter("json"))
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    lines: list[dict[str, Any]] = []
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        lines.extend(json.loads(line) for line in stream.getvalue().splitlines())
