"""The frontend owns no models."""
