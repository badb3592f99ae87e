from django.contrib import admin

from snowflake_db.django.admin import SnowflakeAdminMixin

from .models import Customer, Order


@admin.register(Customer)
class CustomerAdmin(SnowflakeAdminMixin, admin.ModelAdmin):
    list_display = ("name", "snowflake_created")


@admin.register(Order)
class OrderAdmin(SnowflakeAdminMixin, admin.ModelAdmin):
    list_display = ("id", "customer", "total_cents", "snowflake_created")
