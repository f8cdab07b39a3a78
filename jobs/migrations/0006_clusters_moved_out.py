"""Clusters and their inventory, projects' Slurm accounts and drift reports moved to the clusters app."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0002_cluster_in_clusters_app"),
        ("quotas", "0002_cluster_in_clusters_app"),
        ("clusters", "0001_clusters_from_jobs"),
        ("jobs", "0005_cluster_usage_samples"),
    ]

    operations = [
        # The models now live in clusters/ (clusters 0001), tables and rows untouched: state only.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="jobs", to="clusters.cluster"
                    ),
                ),
                migrations.RemoveField(
                    model_name="projectslurmaccount",
                    name="cluster",
                ),
                migrations.RemoveField(
                    model_name="slurmdriftreport",
                    name="cluster",
                ),
                migrations.RemoveField(
                    model_name="gputype",
                    name="cluster",
                ),
                migrations.RemoveField(
                    model_name="partition",
                    name="cluster",
                ),
                migrations.RemoveField(
                    model_name="clusterusagesample",
                    name="cluster",
                ),
                migrations.RemoveField(
                    model_name="clusteraccount",
                    name="cluster",
                ),
                migrations.RemoveField(
                    model_name="clusteraccount",
                    name="user",
                ),
                migrations.RemoveField(
                    model_name="projectslurmaccount",
                    name="project",
                ),
                migrations.DeleteModel(
                    name="Node",
                ),
                migrations.DeleteModel(
                    name="SlurmDriftReport",
                ),
                migrations.DeleteModel(
                    name="GpuType",
                ),
                migrations.DeleteModel(
                    name="Partition",
                ),
                migrations.DeleteModel(
                    name="ClusterUsageSample",
                ),
                migrations.DeleteModel(
                    name="Cluster",
                ),
                migrations.DeleteModel(
                    name="ClusterAccount",
                ),
                migrations.DeleteModel(
                    name="ProjectSlurmAccount",
                ),
            ],
            database_operations=[],
        ),
    ]
