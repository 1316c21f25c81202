"""The audit log names a replay (runs/lineage.py)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("teams", "0007_auditevent_team_create"),
    ]

    operations = [
        migrations.AlterField(
            model_name="auditevent",
            name="action",
            field=models.CharField(
                choices=[
                    ("launch", "launched"),
                    ("cancel", "cancelled"),
                    ("export", "exported"),
                    ("compare", "launched comparison"),
                    ("rerun", "re-ran comparison"),
                    ("retry", "retried"),
                    ("resume", "resumed"),
                    ("clone", "cloned"),
                    ("replay", "replayed"),
                    ("notes", "edited notes and tags of"),
                    ("member_add", "added member"),
                    ("member_role", "changed role"),
                    ("member_remove", "removed member"),
                    ("team_create", "created team"),
                ],
                max_length=20,
            ),
        ),
    ]
