"""`manage.py seed_demo`: the demo tenants, projects, users, allocations and the local clusters. Safe to run again.

The clusters: the 22.05 one from the LOCAL_CLUSTER_* settings, and every newer one `scripts/cluster.sh up`
described as up in DEMO_CLUSTER_REGISTRY (north: Slurm 24.11, south: Slurm 26.05). A real site registers its
clusters with `manage.py cluster_add` instead.

Tenants, projects and memberships are made through tenants.services, as a portal admin would make them, so
they get their Slurm account names and audit events and the Slurm sync is scheduled. A second run only changes
what differs from the demo (a name, a role) and creates nothing twice.
"""

from __future__ import annotations

import calendar
import json
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from billing.models import Rate
from billing.rates import rate_create
from clusters.models import Cluster, ClusterAccount, DirectoryPosixUsername
from jobs.job_services import job_template_save
from jobs.models import JobTemplate
from quotas.models import Allocation, TenantPool, period_start
from quotas.requests import tenant_pool_create
from quotas.services import allocation_create
from tenants import services
from tenants.models import (
    DirectoryGroupRole,
    Project,
    ProjectMembership,
    ProjectRole,
    Tenant,
    TenantMembership,
    TenantRole,
)

DEMO_TENANTS = {
    "acme": ("ACME Research", {"vision": "Computer vision", "nlp": "Natural language processing"}),
    "globex": ("Globex Biotech", {"genomics": "Genomics pipelines"}),
}
# username -> (tenant slug, tenant role, {project slug: project role})
DEMO_USERS = {
    "alice": ("acme", TenantRole.ADMIN, {"vision": ProjectRole.MANAGER, "nlp": ProjectRole.MANAGER}),
    "bob": ("acme", TenantRole.MEMBER, {"vision": ProjectRole.MEMBER}),
    "carol": ("globex", TenantRole.ADMIN, {"genomics": ProjectRole.MANAGER}),
}
# The demo's OpenID provider (scripts/oidc/provider.mjs, id "demo" in PORTAL_OIDC_PROVIDERS): which of its groups
# gives which role (tenant, project or "", role), and its preferred_username is the POSIX user on every cluster.
DEMO_PROVIDER = "demo"
DEMO_GROUP_ROLES: dict[str, list[tuple[str, str, str]]] = {
    "acme-admins": [("acme", "", TenantRole.ADMIN)],
    "acme-vision-members": [("acme", "vision", ProjectRole.MEMBER)],
    "globex-admins": [("globex", "", TenantRole.ADMIN)],
}
DEMO_POSIX_CLAIM = "preferred_username"
# This month's GPU-hours per (cluster, tenant, project): on the 22.05 cluster a large H100 allocation, a smaller
# A100 one and a small one of any type that is easy to use up in a demo (a 4-GPU job of 2 hours needs 8 of its
# 50); on the newer clusters, where they are up, L40S hours for acme/vision and H200 hours for globex/genomics.
# Acme's admins may hand out 200 more on the 22.05 cluster.
DEMO_ALLOCATIONS = {
    ("local", "acme", "vision"): (Decimal(500), "h100"),
    ("local", "acme", "nlp"): (Decimal(100), "a100"),
    ("local", "globex", "genomics"): (Decimal(50), ""),
    ("north", "acme", "vision"): (Decimal(200), "l40s"),
    ("south", "globex", "genomics"): (Decimal(80), "h200"),
}
DEMO_TENANT_POOLS = {"acme": Decimal(200)}
# Prices per GPU-hour per cluster, from the first of this month; other types fall back to the any-type rate.
DEMO_RATES = {
    "local": {"h100": Decimal("2.50"), "a100": Decimal("1.60"), "": Decimal("2.00")},
    "north": {"l40s": Decimal("1.10"), "": Decimal("1.10")},
    "south": {"h200": Decimal("3.40"), "": Decimal("3.40")},
}
DEMO_CURRENCY = "EUR"

# A saved template of acme/vision, next to the built-in ones.
DEMO_TEMPLATE: dict[str, Any] = {
    "name": "Nightly evaluation",
    "description": "Evaluates the latest checkpoint on 2 H100s and prints a score per epoch.",
    "partition": "h100",
    "gpu_type": "h100",
    "gpus": 2,
    "time_limit_minutes": 10,
    "environment": {"EPOCHS": "5"},
    "script": (
        "#!/bin/bash\n"
        'echo "evaluating on GPUs ${CUDA_VISIBLE_DEVICES:-?} of $(hostname)"\n'
        'for epoch in $(seq 1 "$EPOCHS"); do\n'
        '  for pct in 20 40 60 80 100; do printf \'\\repoch %s [%3s%%]\' "$epoch" "$pct"; sleep 0.3; done\n'
        '  printf \'\\nepoch %s score %s\\n\' "$epoch" "0.$((80 + epoch))"\n'
        "done\n"
    ),
}
# The demo's changes are recorded as the system's (an empty actor in the audit log), not as a person's.
ACTOR = None


class Command(BaseCommand):
    help = (
        "Create the demo tenants, projects, users (password from DEMO_PASSWORD), this month's GPU-hours and "
        "prices, and register the local cluster."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._seed()
        except ValidationError as error:
            raise CommandError(f"The demo data could not be created: {' '.join(error.messages)}") from error
        self.stdout.write(self.style.SUCCESS("Demo data ready: tenants acme, globex; users admin, alice, bob, carol."))

    # One transaction: a run that fails halfway leaves the database as it was, and the Slurm syncs the services
    # scheduled run only once everything is committed.
    @transaction.atomic
    def _seed(self) -> None:
        admin = self._user("admin")
        admin.is_staff = admin.is_superuser = True
        admin.save()

        clusters = self._clusters()
        cluster = clusters["local"]

        tenants: dict[str, Tenant] = {}
        projects: dict[tuple[str, str], Project] = {}
        for tenant_slug, (tenant_name, tenant_projects) in DEMO_TENANTS.items():
            tenant = tenants[tenant_slug] = self._tenant(tenant_slug, tenant_name)
            for project_slug, project_name in tenant_projects.items():
                projects[tenant_slug, project_slug] = self._project(tenant, project_slug, project_name)

        for username, (tenant_slug, tenant_role, project_roles) in DEMO_USERS.items():
            user = self._user(username)
            self._tenant_member(tenants[tenant_slug], user, tenant_role)
            for project_slug, project_role in project_roles.items():
                self._project_member(projects[tenant_slug, project_slug], user, project_role)
            for each_cluster in clusters.values():  # the same POSIX users on every cluster
                ClusterAccount.objects.update_or_create(
                    cluster=each_cluster, user=user, defaults={"username": username}
                )

        for group, roles in DEMO_GROUP_ROLES.items():
            for tenant_slug, project_slug, role in roles:
                DirectoryGroupRole.objects.update_or_create(
                    provider=DEMO_PROVIDER,
                    group=group,
                    tenant_slug=tenant_slug,
                    project_slug=project_slug,
                    defaults={"role": role},
                )
        for each_cluster in clusters.values():
            DirectoryPosixUsername.objects.update_or_create(
                provider=DEMO_PROVIDER, cluster=each_cluster, defaults={"claim": DEMO_POSIX_CLAIM}
            )

        vision = projects["acme", "vision"]
        if not JobTemplate.objects.filter(project=vision, name=DEMO_TEMPLATE["name"]).exists():
            self.stdout.write(f"Saving template '{DEMO_TEMPLATE['name']}' in {vision}")
            job_template_save(user=self._user("alice"), project=vision, values=DEMO_TEMPLATE)

        first_day, last_day = _this_month()
        for (cluster_name, tenant_slug, project_slug), (gpu_hours, gpu_type) in DEMO_ALLOCATIONS.items():
            project = projects[tenant_slug, project_slug]
            allocation_cluster = clusters.get(cluster_name)
            if allocation_cluster is None:
                continue  # that cluster is not up on this machine
            if not Allocation.objects.filter(
                project=project,
                cluster=allocation_cluster,
                gpu_type=gpu_type,
                starts_on__lte=last_day,
                ends_on__gte=first_day,
            ).exists():
                kind = f" on {gpu_type}" if gpu_type else ""
                self.stdout.write(
                    f"Granting {project} {gpu_hours} GPU-hours{kind} on {cluster_name} for {first_day:%B %Y}"
                )
                allocation_create(
                    actor=admin,
                    project=project,
                    cluster=allocation_cluster,
                    gpu_hours=gpu_hours,
                    gpu_type=gpu_type,
                    starts_on=first_day,
                    ends_on=last_day,
                    note="demo",
                )
        for tenant_slug, gpu_hours in DEMO_TENANT_POOLS.items():
            tenant = tenants[tenant_slug]
            if not TenantPool.objects.filter(
                tenant=tenant, cluster=cluster, starts_on__lte=last_day, ends_on__gte=first_day
            ).exists():
                self.stdout.write(f"Giving tenant {tenant} a pool of {gpu_hours} GPU-hours for {first_day:%B %Y}")
                tenant_pool_create(
                    actor=admin,
                    tenant=tenant,
                    cluster=cluster,
                    gpu_hours=gpu_hours,
                    starts_on=first_day,
                    ends_on=last_day,
                )

        for cluster_name, rates in DEMO_RATES.items():
            rate_cluster = clusters.get(cluster_name)
            if rate_cluster is None:
                continue
            for gpu_type, price in rates.items():
                if Rate.objects.filter(cluster=rate_cluster, gpu_type=gpu_type).exists():
                    continue
                self.stdout.write(
                    f"Pricing {gpu_type or 'any other GPU type'} on {cluster_name} at {price} {DEMO_CURRENCY}/GPU-hour"
                )
                rate_create(
                    actor=admin,
                    cluster=rate_cluster,
                    gpu_type=gpu_type,
                    price_per_gpu_hour=price,
                    currency=DEMO_CURRENCY,
                    valid_from=period_start(first_day),
                    note="demo",
                )

    def _clusters(self) -> dict[str, Cluster]:
        """The 22.05 cluster from the settings, and the newer local clusters that are up, registered."""
        connections = {
            "local": {
                "slurmrestd_url": settings.LOCAL_CLUSTER_URL,
                "jwt_key_file": settings.LOCAL_CLUSTER_KEY_FILE,
                "log_root": settings.LOCAL_CLUSTER_LOG_ROOT,
                "admin_user": settings.LOCAL_CLUSTER_ADMIN_USER,
            }
        }
        registry = Path(settings.DEMO_CLUSTER_REGISTRY)
        for name in ("north", "south"):
            path = registry / f"{name}.json"
            described = json.loads(path.read_text()) if path.is_file() else {}
            if described.get("status") == "up":
                connections[name] = {
                    key: described[key] for key in ("slurmrestd_url", "jwt_key_file", "log_root", "admin_user")
                }
            else:
                reason = described.get("reason") or f"{path} does not describe it"
                self.stdout.write(f"Cluster {name} is not up on this machine ({reason}); the demo goes without it")
        clusters = {}
        for name, connection in connections.items():
            cluster = Cluster.objects.filter(name=name).first()
            if cluster is None:
                self.stdout.write(f"Registering cluster {name} ({connection['slurmrestd_url']})")
            defaults = {**connection, "is_active": True, "dcgm_prometheus_url": settings.DEMO_DCGM_PROMETHEUS_URL}
            clusters[name], _ = Cluster.objects.update_or_create(name=name, defaults=defaults)
        return clusters

    def _user(self, username: str) -> User:
        user, _ = get_user_model().objects.get_or_create(
            username=username, defaults={"email": f"{username}@example.org"}
        )
        # Reset every run, so that changing DEMO_PASSWORD and seeding again takes effect.
        user.set_password(settings.DEMO_PASSWORD)
        user.save()
        return user

    def _tenant(self, slug: str, name: str) -> Tenant:
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            self.stdout.write(f"Creating tenant {slug}")
            return services.tenant_create(actor=ACTOR, slug=slug, name=name)
        return services.tenant_update(actor=ACTOR, tenant=tenant, name=name)  # a no-op when nothing differs

    def _project(self, tenant: Tenant, slug: str, name: str) -> Project:
        project = Project.objects.filter(tenant=tenant, slug=slug).first()
        if project is None:
            self.stdout.write(f"Creating project {tenant.slug}/{slug}")
            return services.project_create(actor=ACTOR, tenant=tenant, slug=slug, name=name)
        return services.project_update(actor=ACTOR, project=project, name=name)

    def _tenant_member(self, tenant: Tenant, user: User, role: TenantRole) -> None:
        membership = TenantMembership.objects.filter(tenant=tenant, user=user).first()
        if membership is None:
            self.stdout.write(f"Adding {user.get_username()} to tenant {tenant.slug} as {role}")
            services.tenant_member_add(actor=ACTOR, tenant=tenant, user=user, role=role)
        elif membership.role != role:
            self.stdout.write(f"Changing {user.get_username()}'s role in tenant {tenant.slug} to {role}")
            services.tenant_member_change_role(actor=ACTOR, membership=membership, role=role)

    def _project_member(self, project: Project, user: User, role: ProjectRole) -> None:
        membership = ProjectMembership.objects.filter(project=project, user=user).first()
        if membership is None:
            self.stdout.write(f"Adding {user.get_username()} to project {project} as {role}")
            services.project_member_add(actor=ACTOR, project=project, user=user, role=role)
        elif membership.role != role:
            self.stdout.write(f"Changing {user.get_username()}'s role in project {project} to {role}")
            services.project_member_change_role(actor=ACTOR, membership=membership, role=role)


def _this_month() -> tuple[date, date]:
    today = timezone.now().date()
    return today.replace(day=1), today.replace(day=calendar.monthrange(today.year, today.month)[1])
