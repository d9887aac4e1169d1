"""The API's docs page (/api/docs): django-ninja's Swagger UI, from its own files on this server.

django-ninja renders its page with its template and the static files next to it when "ninja"
is in INSTALLED_APPS, and otherwise from a template that loads Swagger UI from a CDN. It is not
an installed app here (taskflow_site/settings.py says why: the engine's processes must not load
it), so the settings add its template and static directories, and this page points django-ninja's
"not installed" branch at its own local template: the same page as before, scripts from
/static/ninja/, nothing fetched from elsewhere.
"""
from ninja.openapi.docs import ABS_TPL_PATH, Swagger


class LocalSwagger(Swagger):
    # The file django-ninja renders with the project's template engine when "ninja" is not an
    # installed app: its own template, which takes its scripts and styles from {% static %}.
    template_cdn = str(ABS_TPL_PATH / "swagger.html")
