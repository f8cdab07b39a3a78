"""Server-rendered pages for researchers and admins; calls selectors and services, owns no business rules."""
