"""Django's database sessions (`SESSION_ENGINE`), each read by a prepared statement (portal/db.py): every page a
signed-in person opens reads its session first, and the ORM spent longer building that query than PostgreSQL
takes to answer it. Storing, expiry and `clearsessions` are Django's, unchanged."""

from __future__ import annotations

from typing import Any

from django.contrib.sessions.backends import db
from django.contrib.sessions.models import Session
from django.utils import timezone

from portal.db import RelatedRows

_SESSION = RelatedRows(Session, alias="stored")
_SESSION_BY_KEY = f"{_SESSION.select} WHERE stored.session_key = %(key)s AND stored.expire_date > %(now)s"


class SessionStore(db.SessionStore):
    def _get_session_from_db(self) -> Any:
        found = _SESSION.fetch(_SESSION_BY_KEY, {"key": self.session_key, "now": timezone.now()})
        if not found:
            self._session_key = None  # as Django's: an unknown or expired key starts a new session
            return None
        return found[0]
