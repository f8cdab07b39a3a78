"""In-portal notifications and the e-mails that go with them."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mass_mail
from django.db import transaction

from tenants.models import Notification, Tenant

logger = logging.getLogger(__name__)


def notifications_send(
    *, users: Iterable[User], tenant: Tenant | None, kind: str, title: str, body: str, link: str = ""
) -> list[Notification]:
    """Leave the same notification for each user and, once the transaction commits, e-mail the ones with an
    address. A failed e-mail is logged: the in-portal notification is the record."""
    recipients = {user.pk: user for user in users}.values()
    notifications = Notification.objects.bulk_create(
        [Notification(user=user, tenant=tenant, kind=kind, title=title, body=body, link=link) for user in recipients]
    )
    text = f"{body}\n\n{settings.PORTAL_BASE_URL}{link}\n" if link else f"{body}\n"
    messages = [
        (f"[GPU portal] {title}", text, settings.DEFAULT_FROM_EMAIL, [user.email]) for user in recipients if user.email
    ]

    def send() -> None:
        try:
            send_mass_mail(messages, fail_silently=False)
        except Exception:
            logger.exception("could not e-mail %d notification(s) %r", len(messages), title)

    if messages:
        transaction.on_commit(send)
    return notifications
