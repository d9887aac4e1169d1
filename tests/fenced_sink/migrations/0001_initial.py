from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies = ()  # tuples: Django copies them into lists

    operations = (
        migrations.CreateModel(
            name="SinkRow",
            fields=[
                ("key", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("fence", models.BigIntegerField()),
                ("value", models.CharField(max_length=200)),
                ("writer", models.CharField(default="", max_length=100)),
            ],
        ),
    )
