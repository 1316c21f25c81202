from django.db import migrations, models

FIELDS = [
    ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
    ("cpus", models.FloatField()),
    ("memory_bytes", models.BigIntegerField()),
    ("gpus", models.FloatField(default=0.0)),
    ("seen_at", models.DateTimeField()),
]


class Migration(migrations.Migration):
    """ClusterCapacity joins configs, beside the check that reads it (configs/policy.py):
    the model is taken over with its row, and its table renamed to the app's."""

    dependencies = [
        ("configs", "0001_initial"),
        ("runs", "0009_seriesbucket_read_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ClusterCapacity", fields=FIELDS, options={"db_table": "runs_clustercapacity"}
                )
            ],
        ),
        migrations.AlterModelTable(name="ClusterCapacity", table=None),
    ]
