"""Three roles: viewer, member, admin. The team owners of before become its admins."""

from django.db import migrations, models


def owners_to_admins(apps, schema_editor):
    apps.get_model("teams", "Membership").objects.filter(role="owner").update(role="admin")


def admins_to_owners(apps, schema_editor):
    Membership = apps.get_model("teams", "Membership")
    Membership.objects.filter(role="admin").update(role="owner")
    Membership.objects.filter(role="viewer").update(role="member")


class Migration(migrations.Migration):
    dependencies = [("teams", "0001_initial")]

    operations = [
        migrations.AlterField(
            model_name="membership",
            name="role",
            field=models.CharField(
                choices=[("viewer", "Viewer"), ("member", "Member"), ("admin", "Admin")],
                default="member",
                max_length=10,
            ),
        ),
        migrations.RunPython(owners_to_admins, admins_to_owners),
    ]
