"""Clusters, their inventory, projects' Slurm accounts, drift reports and usage samples move from jobs/ to here."""

import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MOVED_MODELS = (
    "cluster",
    "clusteraccount",
    "clusterusagesample",
    "gputype",
    "node",
    "partition",
    "projectslurmaccount",
    "slurmdriftreport",
)


def content_types_to_clusters(apps, schema_editor):
    content_types = apps.get_model("contenttypes", "ContentType")
    content_types.objects.filter(app_label="jobs", model__in=MOVED_MODELS).update(app_label="clusters")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("jobs", "0005_cluster_usage_samples"),
        ("tenants", "0003_notifications"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # The models move from jobs/, their tables (jobs_*) and rows as they are: state only; 0002 renames the tables.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Cluster",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.SlugField(max_length=40, unique=True)),
                        ("slurmrestd_url", models.URLField(help_text="e.g. http://127.0.0.1:6820")),
                        (
                            "jwt_key_file",
                            models.CharField(
                                help_text="Path of the cluster's HS256 key on the workers", max_length=500
                            ),
                        ),
                        (
                            "admin_user",
                            models.CharField(
                                default="root",
                                help_text="Slurm operator/admin user for cluster-wide reads and accounts",
                                max_length=64,
                            ),
                        ),
                        (
                            "log_root",
                            models.CharField(
                                help_text="Directory on the shared filesystem for job output", max_length=500
                            ),
                        ),
                        ("is_active", models.BooleanField(default=True)),
                        (
                            "api_version",
                            models.CharField(blank=True, help_text="Detected slurmrestd API version", max_length=16),
                        ),
                        ("slurm_release", models.CharField(blank=True, max_length=32)),
                        ("last_ping_at", models.DateTimeField(blank=True, null=True)),
                        ("last_ping_ok", models.BooleanField(default=False)),
                        ("last_ping_latency_ms", models.FloatField(blank=True, null=True)),
                        ("last_ping_error", models.TextField(blank=True)),
                        ("inventory_synced_at", models.DateTimeField(blank=True, null=True)),
                        ("jobs_listed_at", models.DateTimeField(blank=True, null=True)),
                        ("jobs_synced_at", models.DateTimeField(blank=True, null=True)),
                        ("jobs_sync_error", models.TextField(blank=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        "db_table": "jobs_cluster",
                        "ordering": ["name"],
                    },
                ),
                migrations.CreateModel(
                    name="ClusterAccount",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "username",
                            models.CharField(
                                help_text="The user's login name on the cluster; their jobs run as this user.",
                                max_length=32,
                                validators=[
                                    django.core.validators.RegexValidator(
                                        "^[a-z_][a-z0-9_-]{0,31}$",
                                        "A POSIX user name: lower-case letters, digits, '_' and '-', starting with a letter or '_'.",
                                    )
                                ],
                            ),
                        ),
                        (
                            "cluster",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="accounts",
                                to="clusters.cluster",
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="cluster_accounts",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_clusteraccount",
                        "constraints": [
                            models.UniqueConstraint(fields=("cluster", "user"), name="cluster_account_one_per_user"),
                            models.UniqueConstraint(
                                fields=("cluster", "username"), name="cluster_account_username_unique"
                            ),
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="ClusterUsageSample",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("at", models.DateTimeField(help_text="The minute the sample describes (UTC, seconds zero)")),
                        ("gpus_total", models.PositiveIntegerField(default=0)),
                        ("gpus_used", models.PositiveIntegerField(default=0)),
                        ("gpu_types", models.JSONField(default=dict)),
                        ("partitions", models.JSONField(blank=True, null=True)),
                        ("nodes_by_state", models.JSONField(default=dict, help_text='{"idle": 2, "mixed": 1, ...}')),
                        (
                            "cluster",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="usage_samples",
                                to="clusters.cluster",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_clusterusagesample",
                        "ordering": ["cluster", "-at"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("cluster", "at"), name="cluster_usage_sample_one_per_minute"
                            ),
                            models.CheckConstraint(
                                condition=models.Q(("gpus_used__lte", models.F("gpus_total"))),
                                name="cluster_usage_sample_used_le_total",
                            ),
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="GpuType",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.CharField(max_length=64)),
                        ("gpus_total", models.PositiveIntegerField(default=0)),
                        ("gpus_used", models.PositiveIntegerField(default=0)),
                        ("max_gpus_per_node", models.PositiveIntegerField(default=0)),
                        ("synced_at", models.DateTimeField()),
                        (
                            "cluster",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="gpu_types",
                                to="clusters.cluster",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_gputype",
                        "ordering": ["cluster", "name"],
                        "constraints": [
                            models.UniqueConstraint(fields=("cluster", "name"), name="gpu_type_unique_in_cluster")
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="Node",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.CharField(max_length=64)),
                        (
                            "state",
                            models.CharField(
                                choices=[
                                    ("idle", "Idle"),
                                    ("mixed", "Mixed"),
                                    ("allocated", "Allocated"),
                                    ("draining", "Draining"),
                                    ("drained", "Drained"),
                                    ("down", "Down"),
                                    ("unknown", "Unknown"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("state_flags", models.JSONField(default=list)),
                        ("reason", models.CharField(blank=True, max_length=500)),
                        ("partition_names", models.JSONField(default=list)),
                        ("cpus", models.PositiveIntegerField(default=0)),
                        ("cpus_allocated", models.PositiveIntegerField(default=0)),
                        ("memory_mb", models.PositiveBigIntegerField(default=0)),
                        ("gpu_type", models.CharField(blank=True, max_length=64)),
                        ("gpus_total", models.PositiveIntegerField(default=0)),
                        ("gpus_used", models.PositiveIntegerField(default=0)),
                        ("synced_at", models.DateTimeField()),
                        (
                            "cluster",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="nodes", to="clusters.cluster"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_node",
                        "ordering": ["cluster", "name"],
                        "constraints": [
                            models.UniqueConstraint(fields=("cluster", "name"), name="node_unique_in_cluster"),
                            models.CheckConstraint(
                                condition=models.Q(("gpus_used__lte", models.F("gpus_total"))),
                                name="node_gpus_used_le_total",
                            ),
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="Partition",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.CharField(max_length=64)),
                        ("state", models.CharField(max_length=32)),
                        ("is_default", models.BooleanField(default=False)),
                        (
                            "max_time_minutes",
                            models.PositiveIntegerField(blank=True, help_text="Empty: no limit", null=True),
                        ),
                        ("default_time_minutes", models.PositiveIntegerField(blank=True, null=True)),
                        ("node_names", models.JSONField(default=list)),
                        (
                            "gpu_types",
                            models.JSONField(default=list, help_text="GPU types offered by the partition's nodes"),
                        ),
                        ("max_gpus_per_node", models.PositiveIntegerField(default=0)),
                        ("synced_at", models.DateTimeField()),
                        (
                            "cluster",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="partitions",
                                to="clusters.cluster",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_partition",
                        "ordering": ["cluster", "name"],
                        "constraints": [
                            models.UniqueConstraint(fields=("cluster", "name"), name="partition_unique_in_cluster")
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="ProjectSlurmAccount",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "state",
                            models.CharField(
                                choices=[("pending", "Pending"), ("ready", "Ready"), ("error", "Error")],
                                default="pending",
                                max_length=16,
                            ),
                        ),
                        ("last_error", models.TextField(blank=True)),
                        ("synced_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "cluster",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="project_accounts",
                                to="clusters.cluster",
                            ),
                        ),
                        (
                            "project",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="slurm_accounts",
                                to="tenants.project",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_projectslurmaccount",
                        "ordering": ["cluster__name", "project__slurm_account"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("project", "cluster"), name="project_slurm_account_one_per_cluster"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="SlurmDriftReport",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("started_at", models.DateTimeField()),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
                        ("findings", models.JSONField(blank=True, default=list)),
                        ("error", models.TextField(blank=True)),
                        (
                            "cluster",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="drift_reports",
                                to="clusters.cluster",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_slurmdriftreport",
                        "ordering": ["-started_at", "-id"],
                        "indexes": [
                            models.Index(fields=["cluster", "-started_at"], name="drift_report_cluster_recent")
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        # Admin permissions and log entries follow the models to their new app.
        migrations.RunPython(content_types_to_clusters, migrations.RunPython.noop),
    ]
