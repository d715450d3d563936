"""The package version: its one source (pyproject.toml reads it; manifests record it)."""

__version__ = "0.1.0"
