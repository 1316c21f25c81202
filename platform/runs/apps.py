from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Experiments and runs"

    def ready(self) -> None:
        from runs import signals  # noqa: F401  (connects its receivers)
