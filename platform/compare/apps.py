from django.apps import AppConfig


class CompareConfig(AppConfig):
    name = "compare"
    verbose_name = "Compare runs"
