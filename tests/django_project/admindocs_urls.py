"""A project that serves its own ``AdminSite`` under the name "admin" (Django's advice for its
own site: ``SimpleAdminConfig``, then register what it wants) and admindocs under it.

The site registers auth's models only: the worker pages are not on it, and the default
``admin.site`` (which admindocs views draw their context from) must not hold them either.
"""

from django.contrib.admin import AdminSite
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.urls import include, path

site = AdminSite(name="admin")
site.register(User, UserAdmin)
site.register(Group, GroupAdmin)

urlpatterns = [
    path("admin/doc/", include("django.contrib.admindocs.urls")),
    path("admin/", site.urls),
]
