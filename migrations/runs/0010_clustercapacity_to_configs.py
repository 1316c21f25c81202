from django.db import migrations


class Migration(migrations.Migration):
    """ClusterCapacity now belongs to configs (configs/0002 took over its table)."""

    dependencies = [
        ("runs", "0009_seriesbucket_read_indexes"),
        ("configs", "0002_clustercapacity"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="ClusterCapacity")]),
    ]
