from django.db import models


class SinkRow(models.Model):
    """What a downstream system keeps per task: the last accepted value and the fence of the
    lease that wrote it (FencedWriter compares and sets it)."""

    key = models.CharField(max_length=100, primary_key=True)
    fence = models.BigIntegerField()
    value = models.CharField(max_length=200)
    # Who wrote the row: the test asserts the holder's name, not only the value.
    writer = models.CharField(max_length=100, default="")

    class Meta:
        app_label = "fenced_sink"
