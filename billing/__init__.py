"""Prices per GPU type, priced usage records, invoices and cost estimates."""
