"""Billing models arrive with the billing issue; the app exists so the layout is in place."""
