"""REST API for a project's idle-GPU policy (mounted under /api/v1/): read by those who see the project, changed by
its managers and the tenant's admins."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.efficiency_policy import (
    END_AFTER_IDLE_MINUTES_MAX,
    END_AFTER_IDLE_MINUTES_MIN,
    efficiency_policy_of,
    efficiency_policy_update,
    efficiency_policy_values,
)
from portal.api_errors import ERRORS
from portal.api_inputs import BodyInput
from tenants.selectors import ProjectAction, project_get_for_user


class EfficiencyPolicyOutput(serializers.Serializer[Any]):
    notify_managers = serializers.BooleanField(help_text="The project's managers are told of idle jobs too.")
    end_idle_jobs = serializers.BooleanField(
        help_text="Jobs whose GPUs all stay idle beyond the limit are ended, their owner warned first."
    )
    end_after_idle_minutes = serializers.IntegerField(help_text="How long all GPUs idle before the end.")
    warning_minutes = serializers.IntegerField(help_text="How long before the end the owner is warned.")


class EfficiencyPolicyInput(BodyInput):
    notify_managers = serializers.BooleanField(required=False)
    end_idle_jobs = serializers.BooleanField(required=False)
    end_after_idle_minutes = serializers.IntegerField(
        required=False, help_text=f"{END_AFTER_IDLE_MINUTES_MIN} to {END_AFTER_IDLE_MINUTES_MAX}."
    )
    warning_minutes = serializers.IntegerField(required=False, min_value=0, help_text="Less than the limit.")


@extend_schema_view(
    get=extend_schema(summary="Read a project's idle-GPU policy", responses={200: EfficiencyPolicyOutput, **ERRORS}),
    patch=extend_schema(
        summary="Change a project's idle-GPU policy (project managers, tenant admins)",
        description="Only the fields given change; each change is in the audit log.",
        request=EfficiencyPolicyInput,
        responses={200: EfficiencyPolicyOutput, **ERRORS},
    ),
)
class ProjectEfficiencyPolicyApi(generics.GenericAPIView):  # type: ignore[type-arg]
    serializer_class = EfficiencyPolicyOutput

    def get(self, request: Request, tenant: str, project: str) -> Response:
        found = project_get_for_user(user=request.user, tenant_slug=tenant, project_slug=project)
        return Response(EfficiencyPolicyOutput(efficiency_policy_values(efficiency_policy_of(project=found))).data)

    def patch(self, request: Request, tenant: str, project: str) -> Response:
        found = project_get_for_user(
            user=request.user, tenant_slug=tenant, project_slug=project, action=ProjectAction.MANAGE
        )
        data = EfficiencyPolicyInput(data=request.data)
        data.is_valid(raise_exception=True)
        policy = efficiency_policy_update(actor=request.user, project=found, **data.validated_data)
        return Response(EfficiencyPolicyOutput(efficiency_policy_values(policy)).data)
