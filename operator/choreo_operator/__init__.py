"""choreo operator: watches fabric, tenants and failures; keeps every tenant's schedule current."""
