"""Logs as one line per record: a JSON object (or plain text, for people), carrying the ids of what it is about.

Every process formats through `formatter` (README, "Logs and tracing a job"): the portal's own records and
those of Django, Celery, gunicorn and uvicorn alike. A line learns what it is about from two places: the ids
bound to the context of the work in hand (a request's id by `portal.request_ids`, a Celery task's by
`portal.celery`, a job's while a worker delivers it) and the `extra` fields of the call, which win.

`python -m portal.logs` prints the logging configuration as JSON, for the servers' own options
(gunicorn `--log-config-json`, uvicorn `--log-config`), so that their lines come out in the same format.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import structlog
from structlog.typing import EventDict, WrappedLogger

LOG_FORMATS = ("json", "plain")
# First in every JSON line, in this order; the rest follow in the order they were added.
_LEADING_KEYS = ("timestamp", "level", "logger", "event")
# Added by uvicorn to its records for its own coloured console.
_DROPPED_KEYS = ("color_message",)


def _django_request_replaced_by_its_id(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    # Django logs its answers of 4xx and 5xx with the request object, after the middleware that bound the
    # request's id has returned: the id the request keeps stands in for the object's repr.
    request = event_dict.get("request")
    meta = getattr(request, "META", None)
    if isinstance(meta, dict):
        del event_dict["request"]
        event_dict.setdefault("request_id", meta.get("PORTAL_REQUEST_ID"))
    return event_dict


def _ordered(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    ordered = {key: event_dict.pop(key) for key in _LEADING_KEYS if key in event_dict}
    # An id bound as empty means "none" (a job submitted before ids were recorded): no key, rather than "".
    ordered.update((key, value) for key, value in event_dict.items() if value is not None and value != "")
    for key in _DROPPED_KEYS:
        ordered.pop(key, None)
    return ordered


def formatter(log_format: str = "json") -> logging.Formatter:
    """The formatter of every handler: `json` (one object per line) or `plain`. Named by the logging
    configuration (`"()": "portal.logs.formatter"`), so servers that read a configuration file use it too."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"PORTAL_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    # Python's warnings (deprecations from libraries) go through logging too, so a log holds only formatted lines.
    logging.captureWarnings(True)
    rendering: list[Any] = (
        [structlog.processors.format_exc_info, _ordered, structlog.processors.JSONRenderer(default=str)]
        if log_format == "json"
        else [
            _ordered,
            structlog.dev.ConsoleRenderer(
                colors=False, pad_event_to=0, sort_keys=False, exception_formatter=structlog.dev.plain_traceback
            ),
        ]
    )
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.ExtraAdder(),
            _django_request_replaced_by_its_id,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *rendering],
    )


def logging_config(*, log_format: str, level: str) -> dict[str, Any]:
    """The `logging.config.dictConfig` configuration of every process: one handler on stderr, in `log_format`."""
    console = {"handlers": ["console"], "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"portal": {"()": "portal.logs.formatter", "log_format": log_format}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "portal"}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            # One line per slurmrestd request drowns the workers' own log; the client logs each submission
            # itself (clusters/slurm/client.py) and reports failures.
            "httpx": {"level": "WARNING"},
            "httpcore": {"level": "WARNING"},
            # The servers' own loggers come with handlers of their own: replaced by ours.
            "gunicorn.error": {**console, "level": level},
            # nginx logs every request with its id (deploy/nginx.conf.template); a second line per request
            # from gunicorn would only cost the web tier.
            "gunicorn.access": {**console, "level": "WARNING"},
            "uvicorn": {**console, "level": level},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {**console, "level": "WARNING"},
        },
    }


if __name__ == "__main__":
    from portal.env import env_str

    config = logging_config(
        log_format=env_str("PORTAL_LOG_FORMAT", "json"), level=env_str("PORTAL_LOG_LEVEL", "INFO").upper()
    )
    print(json.dumps(config, indent=2))
