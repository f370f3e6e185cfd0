"""The viewer, operator and admin groups with their permissions (``accounts.roles``)."""
from django.contrib.auth.management import create_permissions
from django.db import migrations


def create_roles(apps, schema_editor):
    from accounts.roles import sync_roles

    # Permissions are normally created after all migrations ran; make them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    sync_roles(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"),
               skip_missing=True)


def drop_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(
        name__in=["viewer", "operator", "admin"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("pipelines", "0003_closed_loop"),
        ("control", "0003_closed_loop"),
        ("audit", "0001_initial"),
    ]
    operations = [migrations.RunPython(create_roles, drop_roles)]
