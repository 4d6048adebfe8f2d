"""The package's one version string (pyproject.toml reads it; measurement caches are keyed by it)."""

__version__ = "0.15.0"
