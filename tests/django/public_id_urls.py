"""URLs of the public-number tests: a converter route, a REST framework view and an admin."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import path, register_converter

from snowflake_db.django.public_ids import PublicIdAdminMixin, public_id_converter
from tests.django_project.shop.models import Order

register_converter(public_id_converter("orders"), "order_number")


def order_by_key(request: HttpRequest, pk: int) -> HttpResponse:
    order = get_object_or_404(Order, pk=pk)
    return JsonResponse({"pk": str(pk), "total_cents": order.total_cents})


def order_by_lookup(request: HttpRequest, number: str) -> HttpResponse:
    order = get_object_or_404(Order, public_id=number)
    return JsonResponse({"pk": str(order.pk)})


class PublicOrderAdmin(PublicIdAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("public_id", "customer", "total_cents")
    search_fields = ("note",)


site = admin.AdminSite(name="public_ids_admin")
site.register(Order, PublicOrderAdmin)

urlpatterns: list[Any] = [
    path("orders/<order_number:pk>/", order_by_key, name="order"),
    path("by-lookup/<str:number>/", order_by_lookup),
    path("admin/", site.urls),
]
