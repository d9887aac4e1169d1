from django.apps import AppConfig


class BoardConfig(AppConfig):
    name = "board"
    verbose_name = "TaskFlow board"
    default_auto_field = "django.db.models.BigAutoField"
