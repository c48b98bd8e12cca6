"""Shared by every stage: the workspace layout, its manifest, document readers and the DuckDB store."""
