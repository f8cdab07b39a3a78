"""`manage.py seed_demo`: the demo tenants, projects, users and the local cluster. Safe to run again."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from jobs.models import Cluster, ClusterAccount
from tenants.models import Project, ProjectMembership, ProjectRole, Tenant, TenantMembership, TenantRole

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


class Command(BaseCommand):
    help = "Create the demo tenants, projects, users (password from DEMO_PASSWORD) and register the local cluster."

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        password = settings.DEMO_PASSWORD
        user_model = get_user_model()

        admin, _ = user_model.objects.get_or_create(username="admin", defaults={"email": "admin@example.org"})
        admin.is_staff = admin.is_superuser = True
        admin.set_password(password)
        admin.save()

        cluster, _ = Cluster.objects.update_or_create(
            name="local",
            defaults={
                "slurmrestd_url": settings.LOCAL_CLUSTER_URL,
                "jwt_key_file": settings.LOCAL_CLUSTER_KEY_FILE,
                "log_root": settings.LOCAL_CLUSTER_LOG_ROOT,
                "admin_user": settings.LOCAL_CLUSTER_ADMIN_USER,
                "is_active": True,
            },
        )

        projects: dict[tuple[str, str], Project] = {}
        for tenant_slug, (tenant_name, tenant_projects) in DEMO_TENANTS.items():
            tenant, _ = Tenant.objects.update_or_create(slug=tenant_slug, defaults={"name": tenant_name})
            for project_slug, project_name in tenant_projects.items():
                projects[tenant_slug, project_slug], _ = Project.objects.update_or_create(
                    tenant=tenant, slug=project_slug, defaults={"name": project_name}
                )

        for username, (tenant_slug, tenant_role, project_roles) in DEMO_USERS.items():
            user, _ = user_model.objects.get_or_create(username=username, defaults={"email": f"{username}@example.org"})
            user.set_password(password)
            user.save()
            tenant = Tenant.objects.get(slug=tenant_slug)
            TenantMembership.objects.update_or_create(tenant=tenant, user=user, defaults={"role": tenant_role})
            for project_slug, project_role in project_roles.items():
                ProjectMembership.objects.update_or_create(
                    project=projects[tenant_slug, project_slug], user=user, defaults={"role": project_role}
                )
            ClusterAccount.objects.update_or_create(cluster=cluster, user=user, defaults={"username": username})

        self.stdout.write(self.style.SUCCESS("Demo data ready: tenants acme, globex; users admin, alice, bob, carol."))
