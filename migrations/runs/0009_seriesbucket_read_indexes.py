from django.db import migrations

# runs/rollups.py WIDEST_INDEX: the widest level's rows (width 65,536), one or two per
# series, which `rollups.totals` reads for every run page, listing and comparison.
# Through the unique index (run, series, width, idx) finding them meant scanning every
# bucket of the run: tens of milliseconds for a long run, each time a page opened.
WIDEST_INDEX = "runs_bucket_widest"
WIDEST = 65536

# runs/rollups.py EXTREMES_INDEX, on SQLite only: `rollups.extremes` (a chart's read)
# finds every column it reads in the index, in order, instead of fetching each bucket's
# row. The ingest writes a run's buckets of every series and level interleaved, so a
# series' rows lie one to a page across the table: one page read per bucket, tens of
# thousands for a long run's page. On PostgreSQL an index on these columns would stop
# updates in place (HOT: 0007's fill factor), and its buffer cache keeps the pages.
EXTREMES_INDEX = "runs_bucket_extremes"
EXTREMES = "run_id, series, width, idx, lo_step, lo, lo_time, hi_step, hi, hi_time"


def create(apps, schema_editor):
    table = schema_editor.quote_name(apps.get_model("runs", "SeriesBucket")._meta.db_table)
    vendor = schema_editor.connection.vendor
    # Concurrently on PostgreSQL: the ingest goes on writing buckets while it builds.
    concurrently = " CONCURRENTLY" if vendor == "postgresql" else ""
    schema_editor.execute(
        f"CREATE INDEX{concurrently} IF NOT EXISTS {WIDEST_INDEX} ON {table} (run_id, series, idx) "
        f"WHERE width = {WIDEST}"
    )
    if vendor == "sqlite":
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {EXTREMES_INDEX} ON {table} ({EXTREMES})")


def drop(apps, schema_editor):
    for name in (EXTREMES_INDEX, WIDEST_INDEX):
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [("runs", "0008_lineage_checkpoints_tags")]

    operations = [migrations.RunPython(create, drop)]
