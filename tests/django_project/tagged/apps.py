from django.apps import AppConfig


class TaggedConfig(AppConfig):
    name = "tests.django_project.tagged"
    label = "tagged"
