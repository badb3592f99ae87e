"""A Django project for the snowflake_db.django tests (see tests/django/conftest.py)."""
