"""First run: make sure someone can log in. With no user at all, create an administrator with a
random password (or take Django's DJANGO_SUPERUSER_* variables). `manage.py serve --ensure-admin`
(what `make run` runs) does it through `ensure_first_admin()` and shows the password once, in
its start-up banner; this command prints it once itself."""
import os
import secrets
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


@dataclass(frozen=True)
class FirstAdmin:
    username: str
    password: str | None  # the generated password; None when DJANGO_SUPERUSER_PASSWORD chose it


def ensure_first_admin() -> FirstAdmin | None:
    """Create the first administrator when the database has no user; None when there was one.
    The generated password exists only in the returned object: the caller shows it once."""
    User = get_user_model()
    if User.objects.exists():
        return None
    username = os.environ.get("DJANGO_SUPERUSER_USERNAME") or "admin"
    chosen = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
    password = chosen or secrets.token_urlsafe(12)
    User.objects.create_superuser(username, os.environ.get("DJANGO_SUPERUSER_EMAIL", ""), password)
    return FirstAdmin(username, None if chosen else password)


class Command(BaseCommand):
    help = "Create a first administrator when the database has no user (never a fixed password)."

    def handle(self, *args, **options):
        admin = ensure_first_admin()
        if admin is None:
            return
        if admin.password:
            self.stdout.write(f"Created the administrator {admin.username!r} with password {admin.password}\n"
                              "It is shown only now: log in and change it (/admin/password_change/).")
        else:
            self.stdout.write(f"Created the administrator {admin.username!r} from DJANGO_SUPERUSER_*.")
