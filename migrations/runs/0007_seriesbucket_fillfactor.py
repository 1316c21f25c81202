from django.db import migrations


def fillfactor(percent: int):
    """Every point write rewrites its series' touched buckets (a few hundred rows). With
    room left on each page PostgreSQL updates them in place (HOT: no new index entries);
    at the default fill of 100% it could do so for about one update in seven, and the
    unique index grew with dead versions that every ON CONFLICT check walked (the upsert
    went from ~60 ms to ~6 ms per write at 50%)."""

    def apply(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            table = schema_editor.quote_name(apps.get_model("runs", "SeriesBucket")._meta.db_table)
            schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {percent})")

    return apply


class Migration(migrations.Migration):
    dependencies = [("runs", "0006_run_error_detail")]

    operations = [migrations.RunPython(fillfactor(50), fillfactor(100))]
