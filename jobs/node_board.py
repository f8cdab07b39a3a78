"""The cluster page's node board: every node under its leaf switch, each GPU of it in use (by which project),
idle, drained or down, with the portal's tenancy applied.

Slurm's node listing says how many GPUs of a node are in use, not by whom; the portal knows the running jobs of
its projects' accounts (`Job.nodes`, `Job.gpu_indices`, and the running tasks of arrays), so the holders are
derived from those. GPUs in use by a job the portal does not know (another Slurm account) are in use by "another
project" too. Only a project the viewer may view (tenancy's `visible_to`: their own, their tenants' as tenant
admin, all for portal admins) is named; any other holder reaches the template as a bare "another project", so no
name of it can leak into the HTML, its attributes or the live partial.

Four queries whatever the cluster's size: its nodes, its running jobs, its running array tasks, and which of their
projects the viewer may view.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from clusters.models import Cluster, Node
from clusters.slurm.codecs.base import expand_hostlist
from clusters.slurm.types import NodeState
from jobs.models import Job, JobArrayTask, JobState
from tenants.models import Project
from tenants.selectors import AnyUser, is_portal_admin, visible_to

# What a free GPU is on a node in each state: a drained (or draining) node takes no new jobs, a down one none.
_FREE_GPU_STATUS = {
    NodeState.DRAINING.value: "drained",
    NodeState.DRAINED.value: "drained",
    NodeState.DOWN.value: "down",
    NodeState.UNKNOWN.value: "down",
}
# The legend, in the order the page draws it: (status, what it means).
GPU_STATUS_LEGEND = (
    ("own", "In use by a project of yours (named)"),
    ("other", "In use by another project"),
    ("idle", "Idle: free, the node takes jobs"),
    ("drained", "Drained: free, the node takes no new jobs"),
    ("down", "Down: the node is down or unreachable"),
)
_STATUS_WORDS = {"own": "", "other": "another project", "idle": "idle", "drained": "drained", "down": "down"}


@dataclass(frozen=True)
class GpuHolder:
    """A job of a project the viewer may view, holding a GPU."""

    tenant_slug: str
    project_slug: str
    job_id: uuid.UUID
    job_name: str
    username: str

    @property
    def project_label(self) -> str:
        return f"{self.tenant_slug}/{self.project_slug}"


@dataclass(frozen=True)
class GpuSlot:
    index: int
    status: str  # own, other, idle, drained, down
    holder: GpuHolder | None = None  # only for "own"

    @property
    def label(self) -> str:
        """The cell's words (never colour alone)."""
        if self.holder is not None:
            return self.holder.project_label
        return _STATUS_WORDS[self.status]


@dataclass(frozen=True)
class NodeCard:
    name: str
    state: str
    reason: str
    gpu_type: str
    partitions: list[str]
    cpus: int
    cpus_allocated: int
    gpus: list[GpuSlot]
    gpus_in_use: int


@dataclass
class SwitchGroup:
    name: str  # "": the cluster describes no switch for these nodes
    nodes: list[NodeCard] = field(default_factory=list)

    @property
    def gpus_total(self) -> int:
        return sum(len(node.gpus) for node in self.nodes)

    @property
    def gpus_in_use(self) -> int:
        return sum(node.gpus_in_use for node in self.nodes)


@dataclass(frozen=True)
class _Hold:
    """One running job's (or array task's) share of one node: these GPU indices, or `count` GPUs at indices Slurm
    did not say."""

    holder: GpuHolder | None
    indices: tuple[int, ...]
    count: int


_JOB_FIELDS = (
    "id",
    "name",
    "nodes",
    "gpus",
    "gpu_indices",
    "project_id",
    "project__slug",
    "project__tenant__slug",
    "cluster_username",
)


_NODE_FIELDS = (
    "name",
    "state",
    "reason",
    "gpu_type",
    "partition_names",
    "cpus",
    "cpus_allocated",
    "gpus_total",
    "gpus_used",
    "switch",
)


def cluster_node_board(*, cluster: Cluster, user: AnyUser) -> list[SwitchGroup]:
    """The cluster's nodes as last synced, grouped by leaf switch (by name; nodes without one last), each with its
    GPUs and who holds them as far as `user` may know."""
    jobs = list(
        Job.objects.filter(cluster=cluster, state=JobState.RUNNING, array="").exclude(nodes="").values(*_JOB_FIELDS)
    )
    tasks = list(
        JobArrayTask.objects.filter(job__cluster=cluster, state=JobState.RUNNING)
        .exclude(nodes="")
        .values("nodes", *(f"job__{name}" for name in _JOB_FIELDS if name != "nodes"))
    )
    tasks = [{name.removeprefix("job__"): value for name, value in task.items()} for task in tasks]
    named = _nameable_projects(user=user, project_ids={row["project_id"] for row in [*jobs, *tasks]})
    holds = _holds_by_node([*jobs, *tasks], named=named)
    groups: dict[str, SwitchGroup] = {}
    nodes = Node.objects.filter(cluster=cluster).order_by("name")
    for node in nodes.only(*_NODE_FIELDS):
        card = _node_card(node, holds.get(node.name, []))
        groups.setdefault(node.switch, SwitchGroup(name=node.switch)).nodes.append(card)
    return sorted(groups.values(), key=lambda group: (group.name == "", group.name))


def _nameable_projects(*, user: AnyUser, project_ids: set[int]) -> set[int]:
    if not project_ids:
        return set()
    if is_portal_admin(user):
        return project_ids
    projects = visible_to(Project.objects.filter(pk__in=project_ids), user=user, project_field="")
    return set(projects.values_list("pk", flat=True))


def _holds_by_node(rows: Iterable[dict[str, Any]], *, named: set[int]) -> dict[str, list[_Hold]]:
    holds: dict[str, list[_Hold]] = defaultdict(list)
    for row in rows:
        holder = None
        if row["project_id"] in named:
            holder = GpuHolder(
                tenant_slug=row["project__tenant__slug"],
                project_slug=row["project__slug"],
                job_id=row["id"],
                job_name=row["name"],
                username=row["cluster_username"],
            )
        indices = row["gpu_indices"] or {}
        for name in expand_hostlist(row["nodes"]):
            known = tuple(int(index) for index in indices.get(name, ()))
            holds[name].append(_Hold(holder=holder, indices=known, count=len(known) or row["gpus"]))
    return holds


def _node_card(node: Node, holds: list[_Hold]) -> NodeCard:
    slots: list[GpuSlot | None] = [None] * node.gpus_total

    def take(index: int, hold: _Hold) -> None:
        slots[index] = GpuSlot(index=index, status="own" if hold.holder else "other", holder=hold.holder)

    # Indices Slurm named first, then the holds whose indices it did not name take the lowest free ones.
    for hold in holds:
        for index in hold.indices:
            if 0 <= index < node.gpus_total and slots[index] is None:
                take(index, hold)
    for hold in holds:
        if hold.indices:
            continue
        for index in [index for index, slot in enumerate(slots) if slot is None][: hold.count]:
            take(index, hold)
    # Slurm counts GPUs in use by jobs the portal does not know (other accounts): another project's.
    unknown = node.gpus_used - sum(1 for slot in slots if slot is not None)
    for index in [index for index, slot in enumerate(slots) if slot is None][: max(unknown, 0)]:
        slots[index] = GpuSlot(index=index, status="other")
    free = _FREE_GPU_STATUS.get(node.state, "idle")
    in_use = sum(1 for slot in slots if slot is not None)
    return NodeCard(
        name=node.name,
        state=node.state,
        reason=node.reason,
        gpu_type=node.gpu_type,
        partitions=list(node.partition_names),
        cpus=node.cpus,
        cpus_allocated=node.cpus_allocated,
        gpus=[slot or GpuSlot(index=index, status=free) for index, slot in enumerate(slots)],
        gpus_in_use=in_use,
    )
