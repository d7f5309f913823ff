"""The model registry: which models this server serves by name (docs/models.md)."""
