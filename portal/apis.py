"""API endpoints that span apps: the current user."""

from __future__ import annotations

from rest_framework.views import APIView

class MeApi(APIView):
    pass
