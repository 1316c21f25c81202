"""A run names the experiment trackers it is exported to (runs/sinks); null, as every
row before has it, is every tracker the site has."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0015_run_failure_record"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="trackers",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
    ]
