"""Quota models arrive with the GPU-hour quotas issue; the app exists so the layout is in place."""
