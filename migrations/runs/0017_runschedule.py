"""A run's recorded schedule, kept for a replay of it (runs.models.RunSchedule)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0016_run_trackers"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunSchedule",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("admissions", models.JSONField(default=list)),
                ("batches", models.JSONField(default=list)),
                ("bytes", models.BigIntegerField()),
                ("steps", models.IntegerField()),
                ("recorded_at", models.DateTimeField(auto_now=True)),
                (
                    "run",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE, related_name="schedule", to="runs.run"
                    ),
                ),
            ],
        ),
    ]
