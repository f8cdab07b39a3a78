"""REST API for invitations by e-mail into a tenant (tenant admins) or a project (its managers and the tenant's
admins), mounted under /api/v1/tenants/. The members endpoints add people by username; these take an address,
as the members pages do (tenants/invitations.py holds the rules)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api_errors import ERRORS
from portal.api_inputs import BodyInput
from tenants import selectors
from tenants.invitations import invitation_get, invitation_list_open, invitation_withdraw, member_invite
from tenants.models import MembershipInvitation, Project, Tenant, TenantRole
from tenants.selectors import ProjectAction, TenantAction


class InvitationOutput(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    email = serializers.EmailField()
    tenant = serializers.CharField(source="tenant.slug")
    project = serializers.SerializerMethodField(help_text="'tenant/project', or null for the tenant's own")
    tenant_role = serializers.CharField()
    project_role = serializers.CharField(help_text="Empty for an invitation to the tenant")
    state = serializers.CharField(help_text="pending, accepted, withdrawn or expired")
    expired = serializers.BooleanField(source="is_expired", help_text="Pending, but past expires_at")
    invited_by = serializers.CharField(source="invited_by.username", allow_null=True, default=None)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()

    def get_project(self, invitation: MembershipInvitation) -> str | None:
        return str(invitation.project) if invitation.project_id else None


class TenantInvitationInput(BodyInput):
    email = serializers.CharField(max_length=254, help_text="Someone with an account gets the role at once.")
    role = serializers.CharField(default=TenantRole.MEMBER, help_text="One of: admin, member.")


class ProjectInvitationInput(BodyInput):
    email = serializers.CharField(
        max_length=254,
        help_text="Someone outside the tenant may be invited by the tenant's admins only; they join it as members.",
    )
    role = serializers.CharField(default="member", help_text="One of: manager, member, viewer.")


def _input(serializer_class: type[serializers.Serializer[Any]], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _created(request: Request, *, tenant: Tenant, project: Project | None, data: dict[str, Any]) -> Response:
    administers = selectors.tenant_role_of(user=request.user, tenant=tenant) == TenantRole.ADMIN
    outcome = member_invite(
        actor=request.user,  # type: ignore[arg-type]  # authenticated: the access helper let them through
        tenant=tenant,
        project=project,
        invitee=data["email"],
        role=data["role"],
        may_add_to_tenant=administers or selectors.is_portal_admin(request.user),
        field="email",
        by_username=False,
    )
    assert outcome.invitation is not None  # by address, there is always the invitation's record
    return Response(InvitationOutput(outcome.invitation).data, status=status.HTTP_201_CREATED)


@extend_schema_view(
    get=extend_schema(summary="List a tenant's pending invitations (tenant admins)", responses=InvitationOutput),
    post=extend_schema(
        summary="Invite someone into a tenant by e-mail (tenant admins)",
        description="An address one account has: the membership at once (state accepted). Otherwise the invitation "
        "waits, pending, until someone signs in with that address, verified, or until it expires.",
        request=TenantInvitationInput,
        responses={201: InvitationOutput, **ERRORS},
    ),
)
class TenantInvitationListApi(generics.ListAPIView):  # type: ignore[type-arg]
    queryset = MembershipInvitation.objects.none()  # tells the schema generator the model; get_queryset answers
    serializer_class = InvitationOutput

    def get_queryset(self) -> QuerySet[MembershipInvitation]:
        tenant = selectors.tenant_get_for_user(
            user=self.request.user, slug=self.kwargs["tenant"], action=TenantAction.MANAGE
        )
        return invitation_list_open(tenant=tenant)

    def post(self, request: Request, tenant: str) -> Response:
        found = selectors.tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE)
        return _created(request, tenant=found, project=None, data=_input(TenantInvitationInput, request))


@extend_schema_view(
    get=extend_schema(summary="Read an invitation of a tenant (tenant admins)", responses={200: InvitationOutput}),
    delete=extend_schema(summary="Withdraw a pending invitation (tenant admins)", responses={204: None, **ERRORS}),
)
class TenantInvitationDetailApi(generics.GenericAPIView):  # type: ignore[type-arg]
    serializer_class = InvitationOutput

    def _invitation(self, request: Request, tenant: str, invitation_id: int) -> MembershipInvitation:
        found = selectors.tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE)
        return invitation_get(tenant=found, invitation_id=invitation_id)

    def get(self, request: Request, tenant: str, invitation_id: int) -> Response:
        return Response(InvitationOutput(self._invitation(request, tenant, invitation_id)).data)

    def delete(self, request: Request, tenant: str, invitation_id: int) -> Response:
        invitation = self._invitation(request, tenant, invitation_id)
        invitation_withdraw(actor=request.user, invitation=invitation)  # type: ignore[arg-type]
        return Response(status=status.HTTP_204_NO_CONTENT)


def _project(request: Request, tenant: str, project: str) -> Project:
    return selectors.project_get_for_user(
        user=request.user, tenant_slug=tenant, project_slug=project, action=ProjectAction.MANAGE
    )


@extend_schema_view(
    get=extend_schema(
        summary="List a project's pending invitations (project managers, tenant admins)", responses=InvitationOutput
    ),
    post=extend_schema(
        summary="Invite someone into a project by e-mail (project managers, tenant admins)",
        request=ProjectInvitationInput,
        responses={201: InvitationOutput, **ERRORS},
    ),
)
class ProjectInvitationListApi(generics.ListAPIView):  # type: ignore[type-arg]
    queryset = MembershipInvitation.objects.none()
    serializer_class = InvitationOutput

    def get_queryset(self) -> QuerySet[MembershipInvitation]:
        found = _project(self.request, self.kwargs["tenant"], self.kwargs["project"])
        return invitation_list_open(tenant=found.tenant, project=found)

    def post(self, request: Request, tenant: str, project: str) -> Response:
        found = _project(request, tenant, project)
        return _created(request, tenant=found.tenant, project=found, data=_input(ProjectInvitationInput, request))


@extend_schema_view(
    get=extend_schema(summary="Read an invitation of a project", responses={200: InvitationOutput}),
    delete=extend_schema(summary="Withdraw a pending invitation of a project", responses={204: None, **ERRORS}),
)
class ProjectInvitationDetailApi(generics.GenericAPIView):  # type: ignore[type-arg]
    serializer_class = InvitationOutput

    def _invitation(self, request: Request, tenant: str, project: str, invitation_id: int) -> MembershipInvitation:
        found = _project(request, tenant, project)
        return invitation_get(tenant=found.tenant, project=found, invitation_id=invitation_id)

    def get(self, request: Request, tenant: str, project: str, invitation_id: int) -> Response:
        return Response(InvitationOutput(self._invitation(request, tenant, project, invitation_id)).data)

    def delete(self, request: Request, tenant: str, project: str, invitation_id: int) -> Response:
        invitation = self._invitation(request, tenant, project, invitation_id)
        invitation_withdraw(actor=request.user, invitation=invitation)  # type: ignore[arg-type]
        return Response(status=status.HTTP_204_NO_CONTENT)
