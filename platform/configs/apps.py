from django.apps import AppConfig


class ConfigsConfig(AppConfig):
    name = "configs"
    verbose_name = "Saved configurations"
