"""The API's endpoints, one django-ninja Router per area (board/api/main.py mounts them)."""
