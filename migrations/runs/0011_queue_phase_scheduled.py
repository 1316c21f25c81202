from django.db import migrations

# A queued run the scheduler let through waits for a worker under this phase and detail.
OLD = ("admitted", "admitted: a worker is starting it")
NEW = ("scheduled", "scheduled: a worker is starting it")


def rename(old, new):
    def run(apps, schema_editor):
        Run = apps.get_model("runs", "Run")
        Run.objects.filter(status="queued", phase=old[0]).update(phase=new[0], phase_detail=new[1])

    return run


class Migration(migrations.Migration):
    """The queue's word for a run it lets through is "scheduled" ("admission" is the
    engine's word for whether a config can ever fit)."""

    dependencies = [("runs", "0010_clustercapacity_to_configs")]

    operations = [migrations.RunPython(rename(OLD, NEW), rename(NEW, OLD))]
