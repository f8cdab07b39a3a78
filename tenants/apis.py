"""REST API for tenants, projects, memberships, tokens and the audit log (mounted under /api/v1/).

Each endpoint parses its input with an input serializer, reaches tenant data through the access helpers
in `tenants.selectors`, calls one service, and renders an output serializer. Errors (including the
404/403 of the access helpers and the ValidationErrors of the services) become `{code, message, fields}`
in `portal.api_errors`.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.contrib.auth import authenticate
from django.core.validators import RegexValidator
from django.db.models import Count, Q, QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import exceptions, generics, serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api_errors import ERRORS
from portal.api_filters import UtcIsoDateTimeFilter
from portal.api_inputs import BodyInput
from tenants import selectors, services
from tenants.authentication import BearerTokenAuthentication
from tenants.backends import LOCAL_PASSWORDS_OFF, local_passwords_enabled
from tenants.models import (
    SLUG_MESSAGE,
    SLUG_PATTERN,
    ApiToken,
    AuditEvent,
    Project,
    ProjectMembership,
    ProjectRole,
    Tenant,
    TenantMembership,
    TenantRole,
)
from tenants.selectors import ProjectAction, TenantAction
from tenants.throttles import PasswordGuessingThrottled, password_attempt_wait, password_failure_record, request_address
from tenants.two_factor import TWO_FACTOR_TOKENS, totp_enabled, totp_required

# Output serializers ------------------------------------------------------------------------------------


class MemberOutput(serializers.Serializer[Any]):
    username = serializers.CharField(source="user.username")
    full_name = serializers.CharField(source="user.get_full_name")
    role = serializers.CharField()
    joined_at = serializers.DateTimeField(source="created_at")


class TenantOutput(serializers.Serializer[Any]):
    slug = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField()
    slurm_parent_account = serializers.CharField()
    project_count = serializers.IntegerField()
    member_count = serializers.IntegerField()
    my_role = serializers.CharField(allow_null=True, help_text="Your tenant role; null if you are not a member.")
    created_at = serializers.DateTimeField()


class ProjectOutput(serializers.Serializer[Any]):
    tenant = serializers.CharField(source="tenant.slug")
    slug = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField()
    slurm_account = serializers.CharField(help_text="The project's Slurm account on every cluster it uses.")
    my_role = serializers.CharField(allow_null=True, help_text="Your project role; null if you have none.")
    created_at = serializers.DateTimeField()


class ProjectDetailOutput(ProjectOutput):
    members = MemberOutput(many=True, source="member_list")


class TokenOutput(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    prefix = serializers.CharField(help_text="The token's first characters, to tell tokens apart.")
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    last_used_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)
    is_live = serializers.BooleanField()


class CreatedTokenOutput(TokenOutput):
    token = serializers.CharField(help_text="The secret. Shown only in this reply; store it now.")


class AuditEventOutput(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    actor = serializers.CharField(source="actor_username", help_text="Empty for changes made by the system.")
    tenant = serializers.CharField(source="tenant.slug", allow_null=True, default=None)
    action = serializers.CharField()
    target_type = serializers.CharField()
    target_id = serializers.CharField()
    target_label = serializers.CharField()
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)
    request_id = serializers.CharField(
        help_text="The id of the request that made the change, as in the portal's logs (X-Request-ID); empty for "
        "changes made outside a request"
    )


# Input serializers -------------------------------------------------------------------------------------


class TenantCreateInput(BodyInput):
    slug = serializers.CharField(
        max_length=40,
        validators=[RegexValidator(SLUG_PATTERN, SLUG_MESSAGE)],
        help_text="Lower-case letters, digits and hyphens; fixed for ever.",
    )
    # Blank names reach the service, whose message says what a good name is.
    name = serializers.CharField(max_length=200, allow_blank=True)
    description = serializers.CharField(required=False, allow_blank=True, default="")


class TenantUpdateInput(BodyInput):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    description = serializers.CharField(required=False, allow_blank=True)


class ProjectCreateInput(TenantCreateInput):
    pass


class ProjectUpdateInput(TenantUpdateInput):
    pass


class TenantMemberAddInput(BodyInput):
    username = serializers.CharField(max_length=150)
    role = serializers.CharField(default=TenantRole.MEMBER, help_text="One of: admin, member.")


class ProjectMemberAddInput(BodyInput):
    username = serializers.CharField(max_length=150, help_text="Must already be a member of the project's tenant.")
    role = serializers.CharField(default=ProjectRole.MEMBER, help_text="One of: manager, member, viewer.")


class RoleChangeInput(BodyInput):
    role = serializers.CharField()


class TokenCreateInput(BodyInput):
    name = serializers.CharField(max_length=100, help_text="Where the token is used, e.g. 'ci-pipeline'.")
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    username = serializers.CharField(required=False, help_text="Only when not logged in: your username.")
    password = serializers.CharField(
        required=False, write_only=True, style={"input_type": "password"}, help_text="Only with username."
    )


def _input(serializer_class: type[serializers.Serializer[Any]], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


# Annotations used by the outputs ------------------------------------------------------------------------


def _with_tenant_counts(tenants: QuerySet[Tenant]) -> QuerySet[Tenant]:
    return tenants.annotate(
        project_count=Count("projects", distinct=True), member_count=Count("memberships", distinct=True)
    )


# Filters -----------------------------------------------------------------------------------------------


class TenantFilter(django_filters.FilterSet):  # type: ignore[misc]
    search = django_filters.CharFilter(method="filter_search", help_text="Part of the slug or name.")

    class Meta:
        model = Tenant
        fields: list[str] = []

    def filter_search(self, queryset: QuerySet[Tenant], name: str, value: str) -> QuerySet[Tenant]:
        return queryset.filter(Q(slug__icontains=value) | Q(name__icontains=value))


class ProjectFilter(django_filters.FilterSet):  # type: ignore[misc]
    tenant = django_filters.CharFilter(field_name="tenant__slug", help_text="A tenant's slug.")
    role = django_filters.ChoiceFilter(
        choices=ProjectRole.choices, field_name="my_role", help_text="Only projects where you hold this role."
    )
    search = django_filters.CharFilter(method="filter_search", help_text="Part of the slug or name.")

    class Meta:
        model = Project
        fields: list[str] = []

    def filter_search(self, queryset: QuerySet[Project], name: str, value: str) -> QuerySet[Project]:
        return queryset.filter(Q(slug__icontains=value) | Q(name__icontains=value))


class TenantMemberFilter(django_filters.FilterSet):  # type: ignore[misc]
    role = django_filters.ChoiceFilter(choices=TenantRole.choices)
    search = django_filters.CharFilter(field_name="user__username", lookup_expr="icontains", help_text="Username.")

    class Meta:
        model = TenantMembership
        fields: list[str] = []


class ProjectMemberFilter(django_filters.FilterSet):  # type: ignore[misc]
    role = django_filters.ChoiceFilter(choices=ProjectRole.choices)
    search = django_filters.CharFilter(field_name="user__username", lookup_expr="icontains", help_text="Username.")

    class Meta:
        model = ProjectMembership
        fields: list[str] = []


class TokenFilter(django_filters.FilterSet):  # type: ignore[misc]
    live = django_filters.BooleanFilter(method="filter_live", help_text="true: only usable tokens.")

    class Meta:
        model = ApiToken
        fields: list[str] = []

    def filter_live(self, queryset: QuerySet[ApiToken], name: str, value: bool) -> QuerySet[ApiToken]:
        live = Q(revoked_at__isnull=True) & (Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))
        return queryset.filter(live) if value else queryset.exclude(live)


class AuditEventFilter(django_filters.FilterSet):  # type: ignore[misc]
    tenant = django_filters.CharFilter(method="filter_tenant", help_text="A tenant's slug (you must be its admin).")
    action = django_filters.CharFilter(help_text="e.g. project.created, project_member.role_changed.")
    actor = django_filters.CharFilter(field_name="actor_username", help_text="Username of who made the change.")
    target_type = django_filters.CharFilter()
    since = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields: list[str] = []

    def filter_tenant(self, queryset: QuerySet[AuditEvent], name: str, value: str) -> QuerySet[AuditEvent]:
        tenant = selectors.tenant_get_for_user(user=self.request.user, slug=value, action=TenantAction.MANAGE)
        return queryset.filter(tenant=tenant)


# Tenants -----------------------------------------------------------------------------------------------


@extend_schema_view(
    get=extend_schema(summary="List the tenants you belong to (all, for portal admins)", responses=TenantOutput),
    post=extend_schema(
        summary="Create a tenant (portal admins)",
        request=TenantCreateInput,
        responses={201: TenantOutput, **ERRORS},
    ),
)
class TenantListApi(generics.ListAPIView):  # type: ignore[type-arg]
    serializer_class = TenantOutput
    filterset_class = TenantFilter

    def get_queryset(self) -> QuerySet[Tenant]:
        return _with_tenant_counts(selectors.tenant_list_for_user(user=self.request.user))

    def post(self, request: Request) -> Response:
        if not selectors.is_portal_admin(request.user):
            raise exceptions.PermissionDenied("Creating a tenant needs a portal admin; ask one to create it for you.")
        data = _input(TenantCreateInput, request)
        tenant = services.tenant_create(actor=request.user, **data)
        tenant = _with_tenant_counts(selectors.tenant_list_for_user(user=request.user)).get(pk=tenant.pk)
        return Response(TenantOutput(tenant).data, status=status.HTTP_201_CREATED)


@extend_schema_view(
    get=extend_schema(summary="Read a tenant", responses={200: TenantOutput, **ERRORS}),
    patch=extend_schema(
        summary="Rename or describe a tenant (tenant admins)",
        request=TenantUpdateInput,
        responses={200: TenantOutput, **ERRORS},
    ),
)
class TenantDetailApi(generics.GenericAPIView):  # type: ignore[type-arg]
    serializer_class = TenantOutput

    def _render(self, tenant: Tenant) -> Response:
        tenant = _with_tenant_counts(selectors.tenant_list_for_user(user=self.request.user)).get(pk=tenant.pk)
        return Response(TenantOutput(tenant).data)

    def get(self, request: Request, tenant: str) -> Response:
        return self._render(selectors.tenant_get_for_user(user=request.user, slug=tenant))

    def patch(self, request: Request, tenant: str) -> Response:
        found = selectors.tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE)
        data = _input(TenantUpdateInput, request)
        return self._render(services.tenant_update(actor=request.user, tenant=found, **data))


# Tenant members ----------------------------------------------------------------------------------------


@extend_schema_view(
    get=extend_schema(summary="List a tenant's members", responses=MemberOutput),
    post=extend_schema(
        summary="Add a user to a tenant (tenant admins)",
        request=TenantMemberAddInput,
        responses={201: MemberOutput, **ERRORS},
    ),
)
class TenantMemberListApi(generics.ListAPIView):  # type: ignore[type-arg]
    queryset = TenantMembership.objects.none()  # tells the schema generator the model; get_queryset answers
    serializer_class = MemberOutput
    filterset_class = TenantMemberFilter

    def get_queryset(self) -> QuerySet[TenantMembership]:
        tenant = selectors.tenant_get_for_user(user=self.request.user, slug=self.kwargs["tenant"])
        return selectors.tenant_membership_list(tenant=tenant)

    def post(self, request: Request, tenant: str) -> Response:
        found = selectors.tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE)
        data = _input(TenantMemberAddInput, request)
        user = services.user_get_by_username(username=data["username"])
        membership = services.tenant_member_add(actor=request.user, tenant=found, user=user, role=data["role"])
        return Response(MemberOutput(membership).data, status=status.HTTP_201_CREATED)


@extend_schema_view(
    get=extend_schema(summary="Read one member of a tenant", responses={200: MemberOutput, **ERRORS}),
    patch=extend_schema(
        summary="Change a tenant member's role (tenant admins)",
        request=RoleChangeInput,
        responses={200: MemberOutput, **ERRORS},
    ),
    delete=extend_schema(
        summary="Remove a user from a tenant and all its projects (tenant admins)", responses={204: None, **ERRORS}
    ),
)
class TenantMemberDetailApi(generics.GenericAPIView):  # type: ignore[type-arg]
    serializer_class = MemberOutput

    def get(self, request: Request, tenant: str, username: str) -> Response:
        found = selectors.tenant_get_for_user(user=request.user, slug=tenant)
        return Response(MemberOutput(selectors.tenant_membership_get(tenant=found, username=username)).data)

    def patch(self, request: Request, tenant: str, username: str) -> Response:
        found = selectors.tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE)
        membership = selectors.tenant_membership_get(tenant=found, username=username)
        data = _input(RoleChangeInput, request)
        membership = services.tenant_member_change_role(actor=request.user, membership=membership, role=data["role"])
        return Response(MemberOutput(membership).data)

    def delete(self, request: Request, tenant: str, username: str) -> Response:
        found = selectors.tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE)
        membership = selectors.tenant_membership_get(tenant=found, username=username)
        services.tenant_member_remove(actor=request.user, membership=membership)
        return Response(status=status.HTTP_204_NO_CONTENT)


# Projects ----------------------------------------------------------------------------------------------


@extend_schema_view(
    get=extend_schema(summary="List every project you can see, across tenants", responses=ProjectOutput),
)
class ProjectListApi(generics.ListAPIView):  # type: ignore[type-arg]
    serializer_class = ProjectOutput
    filterset_class = ProjectFilter

    def get_queryset(self) -> QuerySet[Project]:
        return selectors.project_list_for_user(user=self.request.user)


@extend_schema_view(
    get=extend_schema(summary="List a tenant's projects that you can see", responses=ProjectOutput),
    post=extend_schema(
        summary="Create a project and its Slurm accounts (tenant admins)",
        description="The Slurm account is created on every active cluster by a background task, after this reply.",
        request=ProjectCreateInput,
        responses={201: ProjectDetailOutput, **ERRORS},
    ),
)
class TenantProjectListApi(generics.ListAPIView):  # type: ignore[type-arg]
    queryset = Project.objects.none()  # tells the schema generator the model; get_queryset answers
    serializer_class = ProjectOutput
    filterset_class = ProjectFilter

    def get_queryset(self) -> QuerySet[Project]:
        tenant = selectors.tenant_get_for_user(user=self.request.user, slug=self.kwargs["tenant"])
        return selectors.project_list_for_user(user=self.request.user, tenant=tenant)

    def post(self, request: Request, tenant: str) -> Response:
        found = selectors.tenant_get_for_user(user=request.user, slug=tenant, action=TenantAction.MANAGE)
        data = _input(ProjectCreateInput, request)
        project = services.project_create(actor=request.user, tenant=found, **data)
        return Response(_project_detail(project, request), status=status.HTTP_201_CREATED)


def _project_detail(project: Project, request: Request) -> dict[str, Any]:
    annotated = selectors.project_list_for_user(user=request.user).get(pk=project.pk)
    annotated.member_list = list(selectors.project_membership_list(project=annotated))  # type: ignore[attr-defined]
    return dict(ProjectDetailOutput(annotated).data)


@extend_schema_view(
    get=extend_schema(summary="Read a project with its members", responses={200: ProjectDetailOutput, **ERRORS}),
    patch=extend_schema(
        summary="Rename or describe a project (project managers, tenant admins)",
        request=ProjectUpdateInput,
        responses={200: ProjectDetailOutput, **ERRORS},
    ),
)
class ProjectDetailApi(generics.GenericAPIView):  # type: ignore[type-arg]
    serializer_class = ProjectDetailOutput

    def get(self, request: Request, tenant: str, project: str) -> Response:
        found = selectors.project_get_for_user(user=request.user, tenant_slug=tenant, project_slug=project)
        return Response(_project_detail(found, request))

    def patch(self, request: Request, tenant: str, project: str) -> Response:
        found = selectors.project_get_for_user(
            user=request.user, tenant_slug=tenant, project_slug=project, action=ProjectAction.MANAGE
        )
        data = _input(ProjectUpdateInput, request)
        return Response(_project_detail(services.project_update(actor=request.user, project=found, **data), request))


# Project members ---------------------------------------------------------------------------------------


@extend_schema_view(
    get=extend_schema(summary="List a project's members", responses=MemberOutput),
    post=extend_schema(
        summary="Add a tenant member to a project (project managers, tenant admins)",
        description="Managers and members get a Slurm association on the project's account (by a background task).",
        request=ProjectMemberAddInput,
        responses={201: MemberOutput, **ERRORS},
    ),
)
class ProjectMemberListApi(generics.ListAPIView):  # type: ignore[type-arg]
    queryset = ProjectMembership.objects.none()  # tells the schema generator the model; get_queryset answers
    serializer_class = MemberOutput
    filterset_class = ProjectMemberFilter

    def get_queryset(self) -> QuerySet[ProjectMembership]:
        project = selectors.project_get_for_user(
            user=self.request.user, tenant_slug=self.kwargs["tenant"], project_slug=self.kwargs["project"]
        )
        return selectors.project_membership_list(project=project)

    def post(self, request: Request, tenant: str, project: str) -> Response:
        found = selectors.project_get_for_user(
            user=request.user, tenant_slug=tenant, project_slug=project, action=ProjectAction.MANAGE
        )
        data = _input(ProjectMemberAddInput, request)
        user = services.user_get_by_username(username=data["username"])
        membership = services.project_member_add(actor=request.user, project=found, user=user, role=data["role"])
        return Response(MemberOutput(membership).data, status=status.HTTP_201_CREATED)


@extend_schema_view(
    get=extend_schema(summary="Read one member of a project", responses={200: MemberOutput, **ERRORS}),
    patch=extend_schema(
        summary="Change a project member's role (project managers, tenant admins)",
        request=RoleChangeInput,
        responses={200: MemberOutput, **ERRORS},
    ),
    delete=extend_schema(
        summary="Remove a member from a project (project managers, tenant admins)", responses={204: None, **ERRORS}
    ),
)
class ProjectMemberDetailApi(generics.GenericAPIView):  # type: ignore[type-arg]
    serializer_class = MemberOutput

    def _project(self, request: Request, tenant: str, project: str, action: ProjectAction) -> Project:
        return selectors.project_get_for_user(
            user=request.user, tenant_slug=tenant, project_slug=project, action=action
        )

    def get(self, request: Request, tenant: str, project: str, username: str) -> Response:
        found = self._project(request, tenant, project, ProjectAction.VIEW)
        return Response(MemberOutput(selectors.project_membership_get(project=found, username=username)).data)

    def patch(self, request: Request, tenant: str, project: str, username: str) -> Response:
        found = self._project(request, tenant, project, ProjectAction.MANAGE)
        membership = selectors.project_membership_get(project=found, username=username)
        data = _input(RoleChangeInput, request)
        membership = services.project_member_change_role(actor=request.user, membership=membership, role=data["role"])
        return Response(MemberOutput(membership).data)

    def delete(self, request: Request, tenant: str, project: str, username: str) -> Response:
        found = self._project(request, tenant, project, ProjectAction.MANAGE)
        membership = selectors.project_membership_get(project=found, username=username)
        services.project_member_remove(actor=request.user, membership=membership)
        return Response(status=status.HTTP_204_NO_CONTENT)


# Tokens ------------------------------------------------------------------------------------------------


@extend_schema_view(
    get=extend_schema(summary="List your API tokens", responses=TokenOutput),
    post=extend_schema(
        summary="Create an API token",
        description=(
            "Authenticate with your browser session, or send `username` and `password` in the body (refused with "
            "403 where the portal turns local passwords off: PORTAL_LOCAL_PASSWORDS=false, and for accounts with "
            "two-factor sign-in, or staff who must have it: they create tokens in the browser). "
            "The reply holds the secret once; use it as `Authorization: Bearer <token>`. "
            "A token cannot create further tokens."
        ),
        request=TokenCreateInput,
        responses={201: CreatedTokenOutput, **ERRORS},
        auth=[],
    ),
)
class TokenListApi(generics.ListAPIView):  # type: ignore[type-arg]
    serializer_class = TokenOutput
    filterset_class = TokenFilter

    def get_permissions(self) -> list[Any]:
        if self.request.method == "POST":
            return [AllowAny()]
        return list(super().get_permissions())

    def get_queryset(self) -> QuerySet[ApiToken]:
        return selectors.token_list_for_user(user=self.request.user)

    def post(self, request: Request) -> Response:
        data = _input(TokenCreateInput, request)
        username, password = data.pop("username", None), data.pop("password", None)
        if isinstance(request.successful_authenticator, BearerTokenAuthentication):
            raise exceptions.PermissionDenied(
                "A token cannot create tokens; log in with a browser session or send username and password."
            )
        if request.user.is_authenticated:
            user = request.user
        elif (username or password) and not local_passwords_enabled():
            raise exceptions.PermissionDenied(LOCAL_PASSWORDS_OFF)
        elif username and password:
            # Only wrong passwords count (tenants/throttles.py), and the limit is checked before the password.
            address = request_address(request)
            wait = password_attempt_wait(address=address, username=username)
            if wait is not None:
                raise PasswordGuessingThrottled(wait)
            authenticated = authenticate(request._request, username=username, password=password)
            if authenticated is None:
                password_failure_record(address=address, username=username)
                raise exceptions.AuthenticationFailed("Wrong username or password")
            if totp_enabled(authenticated) or totp_required(authenticated):
                # A password alone must not give what the login page gives only with the second factor.
                raise exceptions.PermissionDenied(TWO_FACTOR_TOKENS)
            user = authenticated
        elif not local_passwords_enabled():
            raise exceptions.NotAuthenticated(LOCAL_PASSWORDS_OFF)
        else:
            raise exceptions.NotAuthenticated("Send 'username' and 'password' with the request, or log in first")
        token, secret = services.token_create(user=user, name=data["name"], expires_at=data["expires_at"])
        body = dict(TokenOutput(token).data)
        body["token"] = secret
        return Response(body, status=status.HTTP_201_CREATED)


@extend_schema_view(
    get=extend_schema(summary="Read one of your tokens", responses={200: TokenOutput, **ERRORS}),
    delete=extend_schema(summary="Revoke one of your tokens at once", responses={204: None, **ERRORS}),
)
class TokenDetailApi(generics.GenericAPIView):  # type: ignore[type-arg]
    serializer_class = TokenOutput

    def get(self, request: Request, token_id: int) -> Response:
        return Response(TokenOutput(selectors.token_get_for_user(user=request.user, token_id=token_id)).data)

    def delete(self, request: Request, token_id: int) -> Response:
        token = selectors.token_get_for_user(user=request.user, token_id=token_id)
        services.token_revoke(actor=request.user, token=token)
        return Response(status=status.HTTP_204_NO_CONTENT)


# Audit log ---------------------------------------------------------------------------------------------


@extend_schema_view(
    get=extend_schema(
        summary="Read the audit log",
        description="Portal admins read every event; tenant admins read their tenants' events; others read none.",
        responses=AuditEventOutput,
    ),
)
class AuditEventListApi(generics.ListAPIView):  # type: ignore[type-arg]
    serializer_class = AuditEventOutput
    filterset_class = AuditEventFilter

    def get_queryset(self) -> QuerySet[AuditEvent]:
        return selectors.audit_event_list_for_user(user=self.request.user)
