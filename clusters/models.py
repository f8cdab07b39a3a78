"""Clusters as data: their slurmrestd endpoint, key, the inventory last synced from them, the projects' Slurm
accounts on them, the reconcile reports, and the utilisation history."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from clusters.slurm.types import NodeState


class Cluster(models.Model):
    """A Slurm cluster reached through its slurmrestd.

    `jwt_key_file` is a path on the Celery workers' hosts: only workers read it, since the key is root on
    the cluster. The web tier shows what the workers last recorded (version, health, inventory).
    """

    name = models.SlugField(max_length=40, unique=True)
    slurmrestd_url = models.URLField(help_text="e.g. http://127.0.0.1:6820")
    jwt_key_file = models.CharField(max_length=500, help_text="Path of the cluster's HS256 key on the workers")
    admin_user = models.CharField(
        max_length=64, default="root", help_text="Slurm operator/admin user for cluster-wide reads and accounts"
    )
    log_root = models.CharField(max_length=500, help_text="Directory on the shared filesystem for job output")
    is_active = models.BooleanField(default=True)

    api_version = models.CharField(max_length=16, blank=True, help_text="Detected slurmrestd API version")
    slurm_release = models.CharField(max_length=32, blank=True)
    last_ping_at = models.DateTimeField(null=True, blank=True)
    last_ping_ok = models.BooleanField(default=False)
    last_ping_latency_ms = models.FloatField(null=True, blank=True)
    last_ping_error = models.TextField(blank=True)
    inventory_synced_at = models.DateTimeField(null=True, blank=True)
    # The job sync asks Slurm only for changes since `jobs_listed_at` (slurmctld's time of its last listing).
    jobs_listed_at = models.DateTimeField(null=True, blank=True)
    jobs_synced_at = models.DateTimeField(null=True, blank=True)
    jobs_sync_error = models.TextField(blank=True)

    # GPU utilisation (jobs/gpu_utilisation.py): where it is read from, and when a GPU counts as idle.
    dcgm_prometheus_url = models.URLField(
        blank=True,
        help_text="A Prometheus that scrapes NVIDIA's DCGM exporter on this cluster's nodes (e.g. "
        "http://prometheus:9090); empty: no DCGM readings",
    )
    slurm_gpu_accounting = models.BooleanField(
        default=False,
        help_text="Slurm's accounting records gres/gpuutil and gres/gpumem (AccountingStorageTRES with an NVML-built "
        "gpu plugin): finished jobs take their utilisation from it where DCGM gave none",
    )
    idle_gpu_threshold_percent = models.PositiveSmallIntegerField(
        default=10, help_text="A GPU whose utilisation stays under this is idle"
    )
    idle_gpu_after_seconds = models.PositiveIntegerField(
        default=1800, help_text="A running job is flagged once a GPU of it has been idle this long"
    )

    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def gpus_free(self) -> int:
        """GPUs not in use as of the last inventory sync (from prefetched `gpu_types` where a view prefetched them)."""
        return sum(max(gpu.gpus_total - gpu.gpus_used, 0) for gpu in self.gpu_types.all())


POSIX_USERNAME_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"
POSIX_USERNAME_MESSAGE = "A POSIX user name: lower-case letters, digits, '_' and '-', starting with a letter or '_'."


class ClusterAccount(models.Model):
    """The POSIX user a portal user's jobs run as on one cluster."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="accounts")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="cluster_accounts")
    username = models.CharField(
        max_length=32,
        validators=[RegexValidator(POSIX_USERNAME_PATTERN, POSIX_USERNAME_MESSAGE)],
        help_text="The user's login name on the cluster; their jobs run as this user.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "user"], name="cluster_account_one_per_user"),
            models.UniqueConstraint(fields=["cluster", "username"], name="cluster_account_username_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.username}@{self.cluster.name}"


class DirectoryPosixUsername(models.Model):
    """Which claim of an OpenID provider is a person's POSIX user name on a cluster: each sign-in through that
    provider sets their ClusterAccount there from it (clusters/directory.py)."""

    provider = models.CharField(max_length=64, help_text="The provider's id in PORTAL_OIDC_PROVIDERS")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="directory_posix_usernames")
    claim = models.CharField(
        max_length=100, default="preferred_username", help_text="e.g. preferred_username, uid, posix_username"
    )

    class Meta:
        ordering = ["provider", "cluster__name"]
        constraints = [
            models.UniqueConstraint(fields=["provider", "cluster"], name="directory_posix_username_one_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.provider}: {self.claim} on {self.cluster.name}"


class Partition(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="partitions")
    name = models.CharField(max_length=64)
    state = models.CharField(max_length=32)
    is_default = models.BooleanField(default=False)
    max_time_minutes = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: no limit")
    default_time_minutes = models.PositiveIntegerField(null=True, blank=True)
    node_names = models.JSONField(default=list)
    gpu_types = models.JSONField(default=list, help_text="GPU types offered by the partition's nodes")
    max_gpus_per_node = models.PositiveIntegerField(default=0)
    # What the partition's largest node has, so a submission is checked without reading the nodes; 0: not known.
    max_cpus_per_node = models.PositiveIntegerField(default=0)
    max_memory_mb_per_node = models.PositiveBigIntegerField(default=0)
    gpus_per_node_by_type = models.JSONField(default=dict, help_text="The most GPUs of each type one node has")
    # For multi-node jobs: how many of its nodes have GPUs of each type ({"h100": 2}), and how many hang under
    # each leaf switch ({"leaf1": 2, "leaf2": 2}; empty: the cluster describes no switches).
    gpu_nodes_by_type = models.JSONField(default=dict)
    nodes_by_switch = models.JSONField(default=dict)
    synced_at = models.DateTimeField()

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="partition_unique_in_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"

    @property
    def max_memory_gb_per_node(self) -> int:
        """The largest node's memory in whole GB (what a job may ask for per node); 0: not known."""
        return self.max_memory_mb_per_node // 1024


class Node(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=[(state.value, state.value.capitalize()) for state in NodeState])
    state_flags = models.JSONField(default=list)
    reason = models.CharField(max_length=500, blank=True)
    partition_names = models.JSONField(default=list)
    cpus = models.PositiveIntegerField(default=0)
    cpus_allocated = models.PositiveIntegerField(default=0)
    memory_mb = models.PositiveBigIntegerField(default=0)
    gpu_type = models.CharField(max_length=64, blank=True)
    gpus_total = models.PositiveIntegerField(default=0)
    gpus_used = models.PositiveIntegerField(default=0)
    # The leaf switch it hangs under, from its Slurm feature `switch-<name>` (README, "Multi-node jobs"); "": unknown.
    switch = models.CharField(max_length=64, blank=True)
    synced_at = models.DateTimeField()

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="node_unique_in_cluster"),
            models.CheckConstraint(
                condition=models.Q(gpus_used__lte=models.F("gpus_total")), name="node_gpus_used_le_total"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


class GpuType(models.Model):
    """A GPU model a cluster offers, with its totals across nodes as of the last sync."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="gpu_types")
    name = models.CharField(max_length=64)
    gpus_total = models.PositiveIntegerField(default=0)
    gpus_used = models.PositiveIntegerField(default=0)
    max_gpus_per_node = models.PositiveIntegerField(default=0)
    synced_at = models.DateTimeField()

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="gpu_type_unique_in_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


class ProjectSlurmAccount(models.Model):
    """A project's Slurm account on one cluster, as the workers last left it.

    One row per project and cluster the project may use; today that is every active cluster, and the
    workers create the rows when they first sync the project. `last_error` says what is not in line yet,
    even when the account itself is ready (e.g. a member who has no username on the cluster).
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        READY = "ready", "Ready"
        ERROR = "error", "Error"

    # PROTECT: deleting a project would leave its Slurm account and its jobs' accounting behind unseen.
    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="slurm_accounts")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="project_accounts")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    last_error = models.TextField(blank=True)
    synced_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["cluster__name", "project__slurm_account"]
        constraints = [
            models.UniqueConstraint(fields=["project", "cluster"], name="project_slurm_account_one_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.project.slurm_account}@{self.cluster.name}"


class SlurmDriftKind(models.TextChoices):
    """What a reconcile run can find between the portal and a cluster's Slurm accounts."""

    MISSING_PARENT_ACCOUNT = "missing_parent_account", "Tenant parent account missing"
    MISSING_PROJECT_ACCOUNT = "missing_project_account", "Project account missing"
    WRONG_PARENT = "wrong_parent", "Account under the wrong parent"
    MISSING_USER_ASSOCIATION = "missing_user_association", "User association missing"
    EXTRA_USER_ASSOCIATION = "extra_user_association", "User association the portal did not grant"
    UNKNOWN_ACCOUNT = "unknown_account", "Account in a tenant's subtree that no project uses"
    GPU_LIMIT = "gpu_limit", "GPU-minute limit differs from the project's allocations"


class SlurmDriftReport(models.Model):
    """One reconcile run of a cluster's Slurm accounts against the portal.

    `findings` is a list of `{kind, account, user, detail, repaired}` (kind from `SlurmDriftKind`).
    `finished_at` stays empty when the run died; `error` says why a run stopped early.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="drift_reports")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    findings = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["cluster", "-started_at"], name="drift_report_cluster_recent")]

    def __str__(self) -> str:
        return f"{self.cluster.name} {self.started_at:%Y-%m-%d %H:%M:%S}"

    @property
    def unrepaired_count(self) -> int:
        return sum(1 for finding in self.findings if not finding.get("repaired"))


# Utilisation history -------------------------------------------------------------------------------------


class ClusterUsageSample(models.Model):
    """A cluster's GPUs and queue at one minute, recorded by the inventory sync for the status pages' charts.

    At most one per cluster and minute (`at` is truncated to the minute); samples older than the retention
    period are deleted as new ones arrive.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="usage_samples")
    at = models.DateTimeField(help_text="The minute the sample describes (UTC, seconds zero)")
    gpus_total = models.PositiveIntegerField(default=0)
    gpus_used = models.PositiveIntegerField(default=0)
    # {"h100": {"total": 4, "used": 1, "idle": 2}}: idle counts only nodes that can take jobs (not drained/down).
    gpu_types = models.JSONField(default=dict)
    # {"h100": {"pending": 2, "running": 1, "pending_gpus": 3, "running_gpus": 1,
    #           "pending_by_gpu_type": {"h100": {"jobs": 2, "gpus": 3}}, "running_by_gpu_type": {"h100": {"jobs": 1,
    #           "gpus": 1}}, "pending_reasons": {"Resources": 2}}}
    # (running_by_gpu_type: in samples recorded since the cluster page shows the queue per GPU type)
    # ("" as a GPU type: any type). Null when Slurm's job listing failed: the queue is unknown, not empty.
    partitions = models.JSONField(null=True, blank=True)
    nodes_by_state = models.JSONField(default=dict, help_text='{"idle": 2, "mixed": 1, ...}')

    class Meta:
        ordering = ["cluster", "-at"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "at"], name="cluster_usage_sample_one_per_minute"),
            models.CheckConstraint(
                condition=models.Q(gpus_used__lte=models.F("gpus_total")), name="cluster_usage_sample_used_le_total"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name} at {self.at:%Y-%m-%d %H:%M}"
