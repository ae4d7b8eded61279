"""The user-facing pipeline API."""
