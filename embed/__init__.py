"""Embedding stage: documents -> overlapping token chunks -> vectors in the DuckDB store."""
