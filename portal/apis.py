"""API endpoints that span apps: the current user, their roles and their cluster usernames."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters.models import ClusterAccount
from tenants.models import ProjectMembership, TenantMembership
from tenants.selectors import is_portal_admin


class _TenantRoleOutput(serializers.Serializer[Any]):
    tenant = serializers.CharField(source="tenant.slug")
    name = serializers.CharField(source="tenant.name")
    role = serializers.CharField()


class _ProjectRoleOutput(serializers.Serializer[Any]):
    tenant = serializers.CharField(source="project.tenant.slug")
    project = serializers.CharField(source="project.slug")
    name = serializers.CharField(source="project.name")
    role = serializers.CharField()


class _ClusterAccountOutput(serializers.Serializer[Any]):
    cluster = serializers.CharField(source="cluster.name")
    username = serializers.CharField()


class MeOutput(serializers.Serializer[Any]):
    username = serializers.CharField()
    full_name = serializers.CharField()
    email = serializers.CharField(help_text="Empty when the account has no e-mail address.")
    is_portal_admin = serializers.BooleanField()
    tenants = _TenantRoleOutput(many=True)
    projects = _ProjectRoleOutput(many=True)
    cluster_accounts = _ClusterAccountOutput(many=True, help_text="Your username on each cluster.")


class MeApi(APIView):
    @extend_schema(summary="Who you are: your roles and your username on each cluster", responses=MeOutput)
    def get(self, request: Request) -> Response:
        user = request.user
        assert user.is_authenticated  # the default permission class lets nobody else in
        body = {
            "username": user.get_username(),
            "full_name": getattr(user, "get_full_name", lambda: "")(),
            "email": getattr(user, "email", ""),
            "is_portal_admin": is_portal_admin(user),
            "tenants": TenantMembership.objects.filter(user=user).select_related("tenant"),
            "projects": ProjectMembership.objects.filter(user=user).select_related("project__tenant"),
            "cluster_accounts": ClusterAccount.objects.filter(user=user, cluster__is_active=True).select_related(
                "cluster"
            ),
        }
        return Response(MeOutput(body).data)
