from django.apps import AppConfig


class BoardConfig(AppConfig):
    name = "board"
    verbose_name = "TaskFlow board"
    # settings.DEFAULT_AUTO_FIELD: BigAutoField on SQL stores, ObjectIdAutoField on MongoDB.
