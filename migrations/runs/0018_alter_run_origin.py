"""A replay: a run's origin when it follows its parent's recorded schedule (runs/lineage.py)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0017_runschedule"),
    ]

    operations = [
        migrations.AlterField(
            model_name="run",
            name="origin",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "launched"),
                    ("retry", "retry of"),
                    ("resume", "resumed from"),
                    ("clone", "clone of"),
                    ("replay", "replay of"),
                ],
                default="",
                max_length=8,
            ),
        ),
    ]
