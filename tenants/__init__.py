"""Tenants (organisations), their projects and memberships, and the one access helper to reach their data."""
