"""What a server process loads as it starts, before it accepts its first request."""

from __future__ import annotations

from django.urls import get_resolver


def routes_load() -> None:
    """Import every view and build the URL resolver's indexes now. Django does both lazily, in a process's first
    request: about 0.2 s of CPU (measured on a submission, README "How fast, measured") that the first request
    to each new gunicorn worker waited for, and on a small machine every request beside it."""
    resolver = get_resolver()
    _ = resolver.url_patterns  # imports the URLconf, and with it every view
    _ = resolver.reverse_dict  # the index `reverse()` builds at its first call
