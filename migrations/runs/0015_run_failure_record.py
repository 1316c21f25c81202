"""A failed run keeps the engine's record of its failure (workers.run.failures.Failure:
kind, actor, node, operation, the error quoted) and, apart, its traceback, for the
site's admins only. Rows failed before keep their error and error_detail as they are."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0014_run_ingest_digest"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="failure",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="run",
            name="error_traceback",
            field=models.TextField(blank=True),
        ),
    ]
