"""A run's ingest token is stored as its SHA-256 hash: the column is renamed and each
stored token replaced by its hash, so a driver started before keeps posting with the
token it holds."""

import hashlib

from django.db import migrations, models


def hash_tokens(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    for run in Run.objects.exclude(ingest_digest="").only("pk", "ingest_digest").iterator():
        clear = run.ingest_digest
        Run.objects.filter(pk=run.pk).update(ingest_digest=hashlib.sha256(clear.encode()).hexdigest())


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0013_run_simulated"),
    ]

    operations = [
        migrations.RenameField(model_name="run", old_name="ingest_token", new_name="ingest_digest"),
        migrations.AlterField(
            model_name="run",
            name="ingest_digest",
            field=models.CharField(blank=True, editable=False, max_length=64),
        ),
        # Not reversible: the clear tokens are gone once hashed (going back leaves every
        # run without a usable token: drivers started before cannot post).
        migrations.RunPython(hash_tokens, migrations.RunPython.noop),
    ]
