"""Everything the MongoDB store needs, in one folder: store.py (the store object), backend/ (the
Django engine), settings.py, apps.py, migrations/."""
