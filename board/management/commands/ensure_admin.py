"""First run: make sure someone can log in. With no user at all, create an administrator with a
random password and print it once (or take Django's DJANGO_SUPERUSER_* variables)."""
import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create a first administrator when the database has no user (never a fixed password)."

    def handle(self, *args, **options):
        User = get_user_model()
        if User.objects.exists():
            return
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME") or "admin"
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        generated = not password
        password = password or secrets.token_urlsafe(12)
        User.objects.create_superuser(username, os.environ.get("DJANGO_SUPERUSER_EMAIL", ""), password)
        if generated:
            self.stdout.write(f"Created the administrator {username!r} with password {password}\n"
                              "It is shown only now: log in and change it (/admin/password_change/).")
        else:
            self.stdout.write(f"Created the administrator {username!r} from DJANGO_SUPERUSER_*.")
