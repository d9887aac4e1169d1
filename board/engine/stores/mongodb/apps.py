"""Django's contrib apps with ObjectId primary keys, for a MongoDB store (settings pick them:
settings.py beside this module). Their own AppConfigs ask for AutoField, which MongoDB refuses."""
from django.contrib.admin.apps import AdminConfig
from django.contrib.auth.apps import AuthConfig
from django.contrib.contenttypes.apps import ContentTypesConfig

from board.engine.stores.mongodb.settings import DEFAULT_AUTO_FIELD


class MongoAdminConfig(AdminConfig):
    default_auto_field = DEFAULT_AUTO_FIELD


class MongoAuthConfig(AuthConfig):
    default_auto_field = DEFAULT_AUTO_FIELD


class MongoContentTypesConfig(ContentTypesConfig):
    default_auto_field = DEFAULT_AUTO_FIELD
