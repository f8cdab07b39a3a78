"""Filled in by the billing work in progress."""

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
