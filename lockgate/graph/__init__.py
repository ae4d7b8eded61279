"""Pipeline to job graph translation (pure)."""
