"""REST API for a user's own in-portal notifications (under /api/v1/): list them, mark them read."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from django.urls import URLPattern, path
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api_errors import ERRORS
from portal.api_pagination import PagePagination
from tenants.models import Notification
from tenants.selectors import AnyUser

# Reads and writes of one's own notifications. They are private to their user (portal admins included) and
# marking one read changes nothing anyone else sees, so there is no audit row.


def notification_list_for_user(*, user: AnyUser) -> QuerySet[Notification]:
    if not user.is_authenticated:
        return Notification.objects.none()
    return Notification.objects.filter(user=user).select_related("tenant").order_by("-created_at", "-id")


def notification_get_for_user(*, user: AnyUser, notification_id: int) -> Notification:
    notification = notification_list_for_user(user=user).filter(pk=notification_id).first()
    if notification is None:
        raise Http404(
            f"No notification {notification_id} exists among yours; list them with GET /api/v1/notifications/."
        )
    return notification


def notification_mark_read(*, notification: Notification) -> Notification:
    """Idempotent: a notification read already keeps the time it was first read."""
    Notification.objects.filter(pk=notification.pk, read_at__isnull=True).update(read_at=timezone.now())
    notification.refresh_from_db(fields=["read_at"])
    return notification


def notifications_mark_all_read(*, user: AnyUser) -> int:
    return notification_list_for_user(user=user).filter(read_at__isnull=True).update(read_at=timezone.now())


# API ---------------------------------------------------------------------------------------------------


class NotificationOutput(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    kind = serializers.CharField(help_text="e.g. quota.threshold, quota.request, quota.request_decided")
    tenant = serializers.CharField(source="tenant.slug", allow_null=True, default=None)
    title = serializers.CharField()
    body = serializers.CharField()
    link = serializers.CharField(help_text="Where to act on it (a portal path)")
    created_at = serializers.DateTimeField()
    read_at = serializers.DateTimeField(allow_null=True)
    is_read = serializers.SerializerMethodField()

    def get_is_read(self, notification: Notification) -> bool:
        return notification.read_at is not None


class NotificationPageOutput(serializers.Serializer[Any]):
    count = serializers.IntegerField(help_text="Notifications matching the filter")
    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)
    unread_count = serializers.IntegerField(help_text="All of your unread notifications")
    results = NotificationOutput(many=True)


class NotificationFilterInput(serializers.Serializer[Any]):
    unread = serializers.BooleanField(required=False, allow_null=True, default=None, help_text="true: unread only")


class NotificationListApi(APIView):
    @extend_schema(
        operation_id="notifications_list",
        summary="Your notifications, newest first, with how many are unread",
        parameters=[NotificationFilterInput],
        responses={200: NotificationPageOutput, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        filters = NotificationFilterInput(data=request.query_params)
        filters.is_valid(raise_exception=True)
        notifications = notification_list_for_user(user=request.user)
        unread_count = notifications.filter(read_at__isnull=True).count()
        unread = filters.validated_data["unread"]
        if unread is not None:
            notifications = notifications.filter(read_at__isnull=unread)
        paginator = PagePagination()
        page = paginator.paginate_queryset(notifications, request, view=self) or []
        response = paginator.get_paginated_response(NotificationOutput(page, many=True).data)
        response.data["unread_count"] = unread_count
        return response


class NotificationReadApi(APIView):
    @extend_schema(
        operation_id="notifications_read",
        summary="Mark one of your notifications read",
        request=None,
        responses={200: NotificationOutput, **ERRORS},
    )
    def post(self, request: Request, notification_id: int) -> Response:
        notification = notification_get_for_user(user=request.user, notification_id=notification_id)
        return Response(NotificationOutput(notification_mark_read(notification=notification)).data)


class NotificationReadAllOutput(serializers.Serializer[Any]):
    marked_read = serializers.IntegerField(help_text="How many were unread")
    unread_count = serializers.IntegerField()


class NotificationReadAllApi(APIView):
    @extend_schema(
        operation_id="notifications_read_all",
        summary="Mark all of your notifications read",
        request=None,
        responses={200: NotificationReadAllOutput, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        marked = notifications_mark_all_read(user=request.user)
        return Response(NotificationReadAllOutput({"marked_read": marked, "unread_count": 0}).data)


urlpatterns: list[URLPattern] = [
    path("notifications/", NotificationListApi.as_view(), name="api-notifications"),
    path("notifications/read-all/", NotificationReadAllApi.as_view(), name="api-notifications-read-all"),
    path("notifications/<int:notification_id>/read/", NotificationReadApi.as_view(), name="api-notification-read"),
]
