"""Partitions keep their largest node's CPUs, memory and GPUs of each type, so a submission reads no nodes."""

from typing import Any

from django.db import migrations, models


def fill_from_nodes(apps: Any, schema_editor: Any) -> None:
    Partition = apps.get_model("clusters", "Partition")
    Node = apps.get_model("clusters", "Node")
    for partition in Partition.objects.all():
        nodes = list(Node.objects.filter(cluster_id=partition.cluster_id, name__in=partition.node_names))
        partition.max_cpus_per_node = max((node.cpus for node in nodes), default=0)
        partition.max_memory_mb_per_node = max((node.memory_mb for node in nodes), default=0)
        by_type: dict[str, int] = {}
        for node in nodes:
            if node.gpu_type and node.gpus_total:
                by_type[node.gpu_type] = max(by_type.get(node.gpu_type, 0), node.gpus_total)
        partition.gpus_per_node_by_type = by_type
        partition.save(update_fields=["max_cpus_per_node", "max_memory_mb_per_node", "gpus_per_node_by_type"])


class Migration(migrations.Migration):
    dependencies = [("clusters", "0002_tables_renamed")]

    operations = [
        migrations.AddField(
            model_name="partition", name="max_cpus_per_node", field=models.PositiveIntegerField(default=0)
        ),
        migrations.AddField(
            model_name="partition", name="max_memory_mb_per_node", field=models.PositiveBigIntegerField(default=0)
        ),
        migrations.AddField(
            model_name="partition",
            name="gpus_per_node_by_type",
            field=models.JSONField(default=dict, help_text="The most GPUs of each type one node has"),
        ),
        migrations.RunPython(fill_from_nodes, migrations.RunPython.noop),
    ]
