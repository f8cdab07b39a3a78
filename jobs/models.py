"""Clusters as data: their slurmrestd endpoint, key, and the inventory last synced from them."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from jobs.slurm.types import NodeState


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

    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ClusterAccount(models.Model):
    """The POSIX user a portal user's jobs run as on one cluster."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="accounts")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="cluster_accounts")
    username = models.CharField(
        max_length=32,
        validators=[
            RegexValidator(
                r"^[a-z_][a-z0-9_-]{0,31}$",
                "A POSIX user name: lower-case letters, digits, '_' and '-', starting with a letter or '_'.",
            )
        ],
        help_text="The user's login name on the cluster; their jobs run as this user.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "user"], name="cluster_account_one_per_user"),
            models.UniqueConstraint(fields=["cluster", "username"], name="cluster_account_username_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.username}@{self.cluster.name}"


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
    synced_at = models.DateTimeField()

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="partition_unique_in_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


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


# Jobs --------------------------------------------------------------------------------------------------


class JobState(models.TextChoices):
    """A portal job's state. `queued` is the portal's own (accepted, not yet in Slurm); the rest follow Slurm."""

    QUEUED = "queued", "Queued"
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    TIMEOUT = "timeout", "Timed out"
    NODE_FAIL = "node_fail", "Node failure"
    REJECTED = "rejected", "Rejected"


FINAL_JOB_STATES = frozenset(
    {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.REJECTED,
    }
)
ACTIVE_JOB_STATES = frozenset(JobState) - FINAL_JOB_STATES


class Job(models.Model):
    """A batch job: submitted through the portal, or found in a project's Slurm account (`is_external`).

    The id is the portal's; it travels to Slurm in the job's comment so a retry can find a job that a
    lost reply left unrecorded. Output paths are chosen by the portal under the cluster's log root.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="jobs")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="jobs")
    # Empty for external jobs whose Slurm user has no portal account on the cluster.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs", null=True, blank=True
    )
    cluster_username = models.CharField(max_length=32, help_text="The POSIX user the job runs as")
    is_external = models.BooleanField(default=False, help_text="Submitted outside the portal; read-only")

    name = models.CharField(max_length=200)
    partition = models.CharField(max_length=64)
    gpu_type = models.CharField(max_length=64, blank=True)
    gpus = models.PositiveIntegerField()
    cpus = models.PositiveIntegerField(null=True, blank=True)
    memory_gb = models.PositiveIntegerField(null=True, blank=True)
    time_limit_minutes = models.PositiveIntegerField()
    script = models.TextField(blank=True)
    environment = models.JSONField(default=dict, blank=True)
    template_id = models.CharField(max_length=64, blank=True, help_text="The template it was made from, if any")
    # A client's `Idempotency-Key`: the same key from the same user returns the first job instead of a second.
    idempotency_key = models.CharField(max_length=100, blank=True)

    working_directory = models.CharField(max_length=1000, blank=True)
    stdout_path = models.CharField(max_length=1000, blank=True)
    stderr_path = models.CharField(max_length=1000, blank=True)

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    # Slurm's own words: its state (e.g. OUT_OF_MEMORY, COMPLETING) and its reason (e.g. Priority).
    slurm_state = models.CharField(max_length=32, blank=True)
    state_reason = models.CharField(max_length=200, blank=True)
    last_error = models.TextField(blank=True, help_text="Why the job is not in Slurm yet, or why it was rejected")

    slurm_job_id = models.PositiveBigIntegerField(null=True, blank=True)
    slurm_submit_time = models.DateTimeField(null=True, blank=True)
    nodes = models.CharField(max_length=500, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)

    # Delivery of the submission: how many times a worker tried, and until when the current try holds it.
    submit_attempts = models.PositiveIntegerField(default=0)
    submit_lease_until = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, related_name="+", null=True, blank=True
    )

    created_at = models.DateTimeField(default=timezone.now, help_text="When the portal accepted it")
    submitted_at = models.DateTimeField(null=True, blank=True, help_text="When Slurm accepted it")
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["project", "-created_at"], name="job_project_recent"),
            models.Index(fields=["cluster", "state"], name="job_cluster_state"),
            models.Index(fields=["user", "-created_at"], name="job_user_recent"),
        ]
        constraints = [
            # Slurm reuses job ids after its state is reset: an external job is known by id and submit time.
            models.UniqueConstraint(
                fields=["cluster", "slurm_job_id", "slurm_submit_time"],
                condition=models.Q(is_external=True),
                name="job_external_unique_in_cluster",
            ),
            models.UniqueConstraint(
                fields=["user", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="job_idempotency_key_unique_per_user",
            ),
            models.CheckConstraint(condition=models.Q(gpus__gte=0), name="job_gpus_not_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_JOB_STATES

    @property
    def slurm_comment(self) -> str:
        return job_comment_tag(self.id)


JOB_COMMENT_PREFIX = "gpuportal:"


def job_comment_tag(job_id: uuid.UUID) -> str:
    """The tag a portal job carries in Slurm's comment field: how a retry and the sync recognise it."""
    return f"{JOB_COMMENT_PREFIX}{job_id}"


class JobTransition(models.Model):
    """One change of a job's state, in order: the job's timeline."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=16, choices=JobState.choices, blank=True)
    to_state = models.CharField(max_length=16, choices=JobState.choices)
    at = models.DateTimeField(default=timezone.now)
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["job", "id"]  # recording order: Slurm's times have one-second resolution
        indexes = [models.Index(fields=["job", "at"], name="job_transition_timeline")]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_state or '-'} -> {self.to_state}"


class JobTemplate(models.Model):
    """A project's saved job shape, which its members can reuse (built-in templates live in code)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, related_name="job_templates")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    script = models.TextField()
    partition = models.CharField(max_length=64, blank=True)
    gpu_type = models.CharField(max_length=64, blank=True)
    gpus = models.PositiveIntegerField(default=1)
    time_limit_minutes = models.PositiveIntegerField(default=60)
    cpus = models.PositiveIntegerField(null=True, blank=True)
    memory_gb = models.PositiveIntegerField(null=True, blank=True)
    environment = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, related_name="+", null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["project", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="job_template_name_unique")]

    def __str__(self) -> str:
        return f"{self.project}: {self.name}"


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
    #           "pending_by_gpu_type": {"h100": {"jobs": 2, "gpus": 3}}, "pending_reasons": {"Resources": 2}}}
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
