from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0012_run_placement"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="simulated",
            field=models.BooleanField(db_index=True, default=False),
        ),
        migrations.AddField(
            model_name="run",
            name="simulation",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
