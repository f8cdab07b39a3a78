"""Jobs: the portal's batch jobs, their state history and saved templates."""

from __future__ import annotations

import datetime
import uuid

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex, OpClass
from django.db import models
from django.db.models.functions import TruncDate, Upper
from django.utils import timezone

from clusters.models import Cluster

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
    gpus = models.PositiveIntegerField(help_text="GPUs on each node (the job's total is gpus x node_count)")
    # A multi-node job (`sbatch --nodes`): how many nodes, each with `gpus` GPUs.
    node_count = models.PositiveIntegerField(default=1)
    # `sbatch --switches=max_switches@switch_wait_minutes`: the most leaf switches its nodes may span (1: all
    # under one switch), and the longest it waits for that before Slurm places it anyway. Null: not asked.
    max_switches = models.PositiveIntegerField(null=True, blank=True)
    switch_wait_minutes = models.PositiveIntegerField(null=True, blank=True)
    cpus = models.PositiveIntegerField(null=True, blank=True)
    memory_gb = models.PositiveIntegerField(null=True, blank=True)
    time_limit_minutes = models.PositiveIntegerField()
    script = models.TextField(blank=True)
    environment = models.JSONField(default=dict, blank=True)
    template_id = models.CharField(max_length=64, blank=True, help_text="The template it was made from, if any")
    # A client's `Idempotency-Key`: the same key from the same user returns the first job instead of a second.
    idempotency_key = models.CharField(max_length=100, blank=True)
    # The id of the request that submitted it (portal/request_ids.py): the worker that delivers it, however much
    # later and after however many crashes, logs that id with the job's own, so one grep follows the job.
    request_id = models.CharField(max_length=64, blank=True)

    # A job array (`sbatch --array`): the expression as submitted, how many tasks it has and its `%N` cap. One portal
    # job stands for the whole array, one Slurm submission; its tasks are `JobArrayTask` rows. Empty: a plain job.
    array = models.CharField(max_length=200, blank=True)
    array_task_count = models.PositiveIntegerField(default=0)
    array_max_running = models.PositiveIntegerField(null=True, blank=True)
    # The tasks counted by state ({pending, running, completed, failed, cancelled}), kept by the sync with the
    # tasks so that a list of arrays reads no task rows.
    array_progress = models.JSONField(default=dict, blank=True)

    working_directory = models.CharField(max_length=1000, blank=True)
    stdout_path = models.CharField(max_length=1000, blank=True)
    stderr_path = models.CharField(max_length=1000, blank=True)

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    # Slurm's own words: its state (e.g. OUT_OF_MEMORY, COMPLETING) and its reason (e.g. Priority).
    slurm_state = models.CharField(max_length=32, blank=True)
    state_reason = models.CharField(max_length=200, blank=True)
    last_error = models.TextField(blank=True, help_text="Why the job is not in Slurm yet, or why it was rejected")

    # While pending: when Slurm's backfill scheduler expects it to start (its `start_time` of a pending job).
    expected_start_at = models.DateTimeField(null=True, blank=True)
    # The dependency as last sent to Slurm, in its own words (`afterok:41,afterany:42`); empty: none. The portal's
    # own record of what the job waits for is its `JobDependency` rows (jobs/pipelines.py).
    slurm_dependency = models.CharField(max_length=1000, blank=True)
    # The job this one runs again ("run again", "edit and run again", "run it there instead").
    rerun_of = models.ForeignKey("self", on_delete=models.SET_NULL, related_name="reruns", null=True, blank=True)

    slurm_job_id = models.PositiveBigIntegerField(null=True, blank=True)
    slurm_submit_time = models.DateTimeField(null=True, blank=True)
    nodes = models.CharField(max_length=500, blank=True)
    # The leaf switches the run's nodes hang under (the cluster's nodes as last synced), in order: ["leaf1"].
    switches = models.JSONField(default=list, blank=True)
    # The GPU devices it holds on each node while it runs, from Slurm's gres_detail: {"gpu01": [0, 1]}.
    gpu_indices = models.JSONField(default=dict, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)

    # Delivery of the submission: how many times a worker tried, and until when the current try holds it.
    submit_attempts = models.PositiveIntegerField(default=0)
    submit_lease_until = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, related_name="+", null=True, blank=True
    )
    # Why it was cancelled, in the canceller's words (optional), or the portal's own when the portal ended it.
    cancel_reason = models.CharField(max_length=500, blank=True)

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
            # The job lists (bench/history.py): everything a user may see, newest first, paged by keyset on
            # (created_at, id); and a project's jobs in one state (or a few: one range each), newest first.
            models.Index(fields=["-created_at", "-id"], name="job_recent"),
            models.Index(fields=["project", "state", "-created_at", "-id"], name="job_project_state_recent"),
            # The lists' search (`name__icontains`, i.e. UPPER(name) LIKE UPPER('%...%')): a rare word is found
            # through it, and ANALYZE keeps statistics of the expression, so a common one is known as such and
            # found by walking job_recent instead of sorting every match. Beside the trigrams, the UTC day the
            # job was created (btree_gin): a search within the last days (jobs.selectors.job_list_window) reads
            # only those days' matches, not every match of the history.
            GinIndex(
                OpClass(Upper("name"), name="gin_trgm_ops"),
                TruncDate("created_at", tzinfo=datetime.UTC),
                name="job_name_search_by_day",
            ),
            # A search of digits is also a Slurm job id (`... OR slurm_job_id = n`): with both sides indexed the
            # planner ORs two index scans instead of reading every job (0.8 s at 1M jobs without it).
            models.Index(fields=["slurm_job_id"], name="job_slurm_job_id"),
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
            models.CheckConstraint(condition=models.Q(node_count__gte=1), name="job_node_count_at_least_one"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_JOB_STATES

    @property
    def slurm_comment(self) -> str:
        return job_comment_tag(self.id)

    @property
    def timeline(self) -> list[JobTransition | JobTransitionArchive]:
        """Every transition in recording order, the archived ones included (prefetch both relations to read it
        in two queries for many jobs, as jobs.selectors does)."""
        steps: list[JobTransition | JobTransitionArchive] = [*self.transitions.all(), *self.archived_transitions.all()]
        return sorted(steps, key=lambda step: step.pk)

    @property
    def is_array(self) -> bool:
        return bool(self.array)

    @property
    def total_gpus(self) -> int:
        """All the GPUs one run holds: its GPUs per node on each of its nodes."""
        return self.gpus * self.node_count

    @property
    def cancelled_by(self) -> str:
        """Who cancelled it, for pages and the API: the user who asked, "the portal" for a cancel the portal
        requested itself (its idle-GPU policy), "Slurm" for a job Slurm ended as cancelled without the portal
        asking (scancel on the cluster, preemption, a dependency never satisfied); empty while not cancelled."""
        if self.cancel_requested_by_id is not None and self.cancel_requested_by is not None:
            return self.cancel_requested_by.username
        if self.cancel_requested_at is not None or self.cancel_reason:  # a cancel no user asked for
            return "the portal"
        if self.state == JobState.CANCELLED:
            return "Slurm"
        return ""


JOB_COMMENT_PREFIX = "gpuportal:"


def job_comment_tag(job_id: uuid.UUID) -> str:
    """The tag a portal job carries in Slurm's comment field: how a retry and the sync recognise it."""
    return f"{JOB_COMMENT_PREFIX}{job_id}"


def job_id_from_tag(comment: str) -> uuid.UUID | None:
    """The portal job id in a Slurm job's comment, if it carries the portal's tag."""
    if not comment.startswith(JOB_COMMENT_PREFIX):
        return None
    try:
        return uuid.UUID(comment[len(JOB_COMMENT_PREFIX) :])
    except ValueError:
        return None


class JobTransition(models.Model):
    """One change of a job's state, in order: the job's timeline."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=16, choices=JobState.choices, blank=True)
    to_state = models.CharField(max_length=16, choices=JobState.choices)
    at = models.DateTimeField(default=timezone.now)
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["job", "id"]  # recording order: Slurm's times have one-second resolution
        indexes = [
            models.Index(fields=["job", "at"], name="job_transition_timeline"),
            # What the archiving (jobs/history_archive.py) selects by: the oldest first, found without a scan.
            models.Index(fields=["at"], name="job_transition_at"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_state or '-'} -> {self.to_state}"


class JobTransitionArchive(models.Model):
    """A transition older than HISTORY_ARCHIVE_AFTER_MONTHS, moved out of the hot table with its id unchanged, so
    that a job's timeline (`Job.timeline`) reads both tables in recording order (jobs/history_archive.py)."""

    id = models.BigIntegerField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="archived_transitions")
    from_state = models.CharField(max_length=16, choices=JobState.choices, blank=True)
    to_state = models.CharField(max_length=16, choices=JobState.choices)
    at = models.DateTimeField()
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["job", "id"]
        indexes = [models.Index(fields=["at", "id"], name="job_transition_archive_at")]  # the export's order

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_state or '-'} -> {self.to_state} (archived)"


# GPU efficiency ----------------------------------------------------------------------------------------


class UtilisationSource(models.TextChoices):
    DCGM = "dcgm", "DCGM exporter via Prometheus"
    SLURM = "slurm", "Slurm accounting (gres/gpuutil, gres/gpumem)"


class JobEfficiency(models.Model):
    """How well a job used its GPUs: running aggregates the collector keeps (jobs/gpu_utilisation.py), never a
    row per scrape. Mean utilisation is `utilisation_percent_seconds / observed_gpu_seconds`; idle GPU-seconds are
    the observed seconds a GPU spent under its cluster's threshold.

    `idle_since` is when the GPUs idle now went idle (null while none is); `flagged_at` when the job was
    flagged (a GPU idle for the cluster's limit; cleared when they work again); `notified_at` when its user was
    told, once per job. `warned_at` and `ended_at` belong to a project's opt-in to end idle jobs.
    """

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="efficiency")
    source = models.CharField(max_length=8, choices=UtilisationSource.choices)
    observed_gpu_seconds = models.PositiveBigIntegerField(default=0)
    utilisation_percent_seconds = models.FloatField(default=0)
    peak_memory_mib = models.PositiveIntegerField(null=True, blank=True)
    idle_gpu_seconds = models.PositiveBigIntegerField(default=0)
    idle_gpus = models.PositiveIntegerField(default=0, help_text="GPUs idle at the last reading")
    idle_since = models.DateTimeField(null=True, blank=True)
    # Since when every GPU of it read idle (null while one works): only such a job may be ended for idling.
    all_gpus_idle_since = models.DateTimeField(null=True, blank=True)
    flagged_at = models.DateTimeField(null=True, blank=True)
    notified_at = models.DateTimeField(null=True, blank=True)
    warned_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)
    # Added to its month's billing.EfficiencySum (billing/efficiency.py `efficiency_sums_add`), once the job has
    # ended and nothing has changed it for a while; until then the efficiency report sums it live.
    summed = models.BooleanField(default=False, db_default=False)

    class Meta:
        indexes = [
            models.Index(fields=["flagged_at"], name="job_efficiency_flagged"),
            # What the efficiency report sums live, and what efficiency_sums_add picks up: few rows, however long
            # the history.
            models.Index(fields=["job"], condition=models.Q(summed=False), name="job_efficiency_unsummed"),
            # A month's worst jobs: walked from the idlest, the month and scope checked on the way.
            models.Index(fields=["-idle_gpu_seconds", "job"], name="job_efficiency_idlest"),
        ]

    def __str__(self) -> str:
        return f"efficiency of {self.job_id}"

    @property
    def mean_utilisation_percent(self) -> float | None:
        if not self.observed_gpu_seconds:
            return None
        return self.utilisation_percent_seconds / self.observed_gpu_seconds


class JobGpuUsage(models.Model):
    """One GPU of a running job, as the DCGM readings found it: the running aggregates of that GPU and what the
    idle detector needs (its last reading and since when it has been idle)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="gpu_usage")
    node = models.CharField(max_length=64)
    gpu_index = models.PositiveSmallIntegerField()
    gpu_uuid = models.CharField(max_length=64, blank=True)
    observed_seconds = models.PositiveIntegerField(default=0)
    utilisation_percent_seconds = models.FloatField(default=0)
    peak_memory_mib = models.PositiveIntegerField(default=0)
    idle_seconds = models.PositiveIntegerField(default=0)
    idle_since = models.DateTimeField(null=True, blank=True)
    last_utilisation_percent = models.FloatField(default=0)
    last_memory_mib = models.PositiveIntegerField(default=0)
    # Seconds are counted whole: this moves by the seconds counted, so the fractions are carried, not lost.
    counted_until = models.DateTimeField()

    class Meta:
        ordering = ["job", "node", "gpu_index"]
        constraints = [models.UniqueConstraint(fields=["job", "node", "gpu_index"], name="job_gpu_usage_once")]

    def __str__(self) -> str:
        return f"{self.job_id} {self.node}/{self.gpu_index}"


class ProjectEfficiencyPolicy(models.Model):
    """A project's choices about idle GPUs: whether its managers hear of idle jobs too, and whether jobs idle
    beyond its own limit are ended (after a warning to their owner). Without a row: neither."""

    project = models.OneToOneField("tenants.Project", on_delete=models.CASCADE, related_name="efficiency_policy")
    notify_managers = models.BooleanField(default=False, help_text="Project managers are told of idle jobs too")
    end_idle_jobs = models.BooleanField(
        default=False, help_text="End jobs whose GPUs all stay idle beyond the limit below, warning the owner first"
    )
    end_after_idle_seconds = models.PositiveIntegerField(
        default=7200, help_text="A job is ended once all its GPUs have been idle this long"
    )
    warning_seconds = models.PositiveIntegerField(default=900, help_text="How long before the end the owner is warned")

    class Meta:
        verbose_name_plural = "project efficiency policies"

    def __str__(self) -> str:
        return f"efficiency policy of {self.project}"


class JobEndWatch(models.Model):
    """A user's wish to be told when a job ends, with its outcome and cost (`billing.job_end_notices` tells them
    once the cost is known, and sets `notified_at`)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="end_watches")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="job_end_watches")
    created_at = models.DateTimeField(default=timezone.now)
    notified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "user"], name="job_end_watch_once_per_user")]
        indexes = [
            models.Index(fields=["job"], condition=models.Q(notified_at__isnull=True), name="job_end_watch_waiting")
        ]

    def __str__(self) -> str:
        return f"{self.user} watches {self.job_id}"


class PipelineEndWatch(models.Model):
    """A user's wish to be told when the whole pipeline of `job` ends (the jobs connected to it by dependencies,
    whichever way), with each step's outcome and the total cost (`billing.job_end_notices` tells them once every
    step has ended or can never run, and the cost of every step that ran is known, and sets `notified_at`)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="pipeline_end_watches")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="pipeline_end_watches")
    created_at = models.DateTimeField(default=timezone.now)
    notified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "user"], name="pipeline_end_watch_once_per_user")]
        indexes = [
            models.Index(
                fields=["job"], condition=models.Q(notified_at__isnull=True), name="pipeline_end_watch_waiting"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} watches the pipeline of {self.job_id}"


class JobArrayTask(models.Model):
    """One task of a job array: its own Slurm job id once it started, state, times, exit code and nodes.

    Created with the job (one row per index), moved by the sync in bulk. The array's own row (`Job`) carries the
    overall state; see `jobs.array_sync`.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="array_tasks")
    index = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    slurm_state = models.CharField(max_length=32, blank=True)
    state_reason = models.CharField(max_length=200, blank=True)
    # Slurm gives a task a job id of its own when it starts (the array's id until then).
    slurm_job_id = models.PositiveBigIntegerField(null=True, blank=True)
    nodes = models.CharField(max_length=500, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="job_array_task_unique_index")]
        indexes = [models.Index(fields=["job", "state"], name="job_array_task_state")]

    def __str__(self) -> str:
        return f"{self.job_id}[{self.index}]: {self.state}"

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_JOB_STATES


class DependencyCondition(models.TextChoices):
    """When a job may start after one of its parents, in Slurm's words (`sbatch --dependency`). On an array
    parent Slurm reads them over all its tasks: `afterok` needs every task to succeed, `afternotok` one to fail."""

    AFTER_OK = "afterok", "after it succeeds"
    AFTER_ANY = "afterany", "after it ends, however it ends"
    AFTER_NOT_OK = "afternotok", "after it fails"


class JobDependency(models.Model):
    """One edge of a pipeline: `child` may start only once `parent` (a job of the same project and cluster) has
    ended as `condition` asks. The worker sends it to Slurm as the child's `dependency` (jobs/pipelines.py)."""

    child = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependencies")
    parent = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependent_edges")
    condition = models.CharField(max_length=16, choices=DependencyCondition.choices)

    class Meta:
        ordering = ["child", "id"]
        constraints = [
            models.UniqueConstraint(fields=["child", "parent"], name="job_dependency_once"),
            models.CheckConstraint(condition=~models.Q(child=models.F("parent")), name="job_dependency_not_self"),
        ]
        indexes = [models.Index(fields=["parent"], name="job_dependency_parent")]

    def __str__(self) -> str:
        return f"{self.child_id} {self.condition} {self.parent_id}"


class JobTemplate(models.Model):
    """A project's saved job shape, which its members can reuse (built-in templates live in code)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, related_name="job_templates")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    script = models.TextField()
    partition = models.CharField(max_length=64, blank=True)
    gpu_type = models.CharField(max_length=64, blank=True)
    gpus = models.PositiveIntegerField(default=1, help_text="GPUs on each node")
    node_count = models.PositiveIntegerField(default=1)
    time_limit_minutes = models.PositiveIntegerField(default=60)
    cpus = models.PositiveIntegerField(null=True, blank=True)
    memory_gb = models.PositiveIntegerField(null=True, blank=True)
    environment = models.JSONField(default=dict, blank=True)
    array = models.CharField(max_length=200, blank=True, help_text="A job array's indexes, such as 0-99%10")
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


# Restores ----------------------------------------------------------------------------------------------

# The first words of the timeline entry of a job rebuilt from Slurm after a restore (how the portal finds them).
RECOVERED_DETAIL = "Recovered from Slurm after a restore of the portal's database"


class DatabaseIdentity(models.Model):
    """One row that tells whether the database is the one the portal last wrote, or a restored copy of it.

    `written_xid` is the id of the transaction that wrote the row. A restore from `pg_dump` writes every row
    again, in the restore's own transaction, so the row's `xmin` no longer matches it (see jobs/database_restores.py).
    `checked_at` is refreshed by every check: in a restored copy it tells when its backup was about to be taken.
    """

    written_xid = models.BigIntegerField()
    checked_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"database identity (transaction {self.written_xid}, checked {self.checked_at:%Y-%m-%d %H:%M:%S})"


class DatabaseRestore(models.Model):
    """A restore of the portal's database that the portal noticed (or an operator declared), and what it
    does about it: every cluster's Slurm is searched for the jobs the backup did not have."""

    detected_at = models.DateTimeField(default=timezone.now)
    # The restored copy's last check: its backup was taken after this moment, so whatever it lost was
    # submitted after it. Slurm is searched from here (less a margin).
    backup_after = models.DateTimeField()
    declared_by = models.CharField(max_length=200, blank=True, help_text="Empty: noticed by the portal itself")
    reviewed_at = models.DateTimeField(null=True, blank=True, help_text="When an operator reviewed what it lost")
    reviewed_by = models.CharField(max_length=200, blank=True)
    # Jobs accepted after the backup that had not reached Slurm when the portal stopped: a delivery message named
    # them after the restore, and neither the restored database nor Slurm has them. They never ran; their
    # submitters must send them again.
    undelivered_jobs = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-detected_at", "-id"]

    def __str__(self) -> str:
        return f"restore noticed {self.detected_at:%Y-%m-%d %H:%M:%S} (backup after {self.backup_after:%H:%M:%S})"


class ClusterRecovery(models.Model):
    """The search of one cluster's Slurm (live listing and accounting, by the portal's tag in the comment, in
    the projects' accounts) for jobs a restore lost; repeated until one search after the settling time."""

    restore = models.ForeignKey(DatabaseRestore, on_delete=models.CASCADE, related_name="clusters")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="recoveries")
    searches = models.PositiveIntegerField(default=0)
    searched_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    recovered_jobs = models.PositiveIntegerField(default=0)
    # Tagged Slurm jobs that could not be rebuilt, with why: [{slurm_job_id, account, user, comment, reason}].
    not_rebuilt = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["restore", "cluster"]
        constraints = [models.UniqueConstraint(fields=["restore", "cluster"], name="cluster_recovery_once")]

    def __str__(self) -> str:
        return f"{self.restore}: {self.cluster.name}"
