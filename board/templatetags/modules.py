"""{% module_preloads "board/main.js" %}: a <link rel="modulepreload"> for every module a page's
entry module imports, directly or through others.

The pages' scripts are native ES modules with no build step (static/board/). Without these links
the browser finds the imports one level at a time (main.js, then details.js, then attempts.js,
then timeline.js ...), a round trip per level before the first card can be drawn; with them it
asks for every module at once while it parses the page. The list is read from the modules' own
import lines, so it cannot go stale."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import PurePosixPath

from django import template
from django.conf import settings
from django.contrib.staticfiles import finders
from django.templatetags.static import static
from django.utils.html import format_html_join

register = template.Library()

# `import ... from "./x.js"` (over several lines too) and `import "./x.js"`: static imports of a
# sibling module, the only kind the pages use.
STATIC_IMPORT = re.compile(r"""(?:\bfrom|^\s*import)\s*["'](\./[\w.-]+\.js)["']""", re.MULTILINE)


def _imports_of(path: str) -> list[str]:
    found = finders.find(path)
    if found is None:
        raise template.TemplateSyntaxError(f"module_preloads: no static file {path!r}")
    with open(found, encoding="utf-8") as source:
        text = source.read()
    folder = PurePosixPath(path).parent
    return [str(folder / name[2:]) for name in STATIC_IMPORT.findall(text)]


def imported_modules(entry: str) -> list[str]:
    """Every module `entry` imports, directly or not, in the order first met (entry excluded)."""
    seen, order, pending = {entry}, [], [entry]
    while pending:
        for module in _imports_of(pending.pop(0)):
            if module not in seen:
                seen.add(module)
                order.append(module)
                pending.append(module)
    return order


_cached_imported_modules = lru_cache(maxsize=None)(imported_modules)


@register.simple_tag
def module_preloads(entry: str) -> str:
    # DEBUG reads the files each time (a module edited while the server runs); otherwise once.
    modules = imported_modules(entry) if settings.DEBUG else _cached_imported_modules(entry)
    return format_html_join("\n  ", '<link rel="modulepreload" href="{}">', ((static(m),) for m in [entry, *modules]))
