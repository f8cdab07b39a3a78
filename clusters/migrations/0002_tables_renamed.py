"""The moved tables take the clusters app's names (jobs_cluster -> clusters_cluster, ...), rows and keys kept."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0001_clusters_from_jobs"),
        ("jobs", "0006_clusters_moved_out"),
    ]

    operations = [
        migrations.AlterModelTable(
            name="cluster",
            table=None,
        ),
        migrations.AlterModelTable(
            name="clusteraccount",
            table=None,
        ),
        migrations.AlterModelTable(
            name="clusterusagesample",
            table=None,
        ),
        migrations.AlterModelTable(
            name="gputype",
            table=None,
        ),
        migrations.AlterModelTable(
            name="node",
            table=None,
        ),
        migrations.AlterModelTable(
            name="partition",
            table=None,
        ),
        migrations.AlterModelTable(
            name="projectslurmaccount",
            table=None,
        ),
        migrations.AlterModelTable(
            name="slurmdriftreport",
            table=None,
        ),
    ]
