"""The corpus snapshot: what search shows of the documents and chunks, beside the index files. This package
owns its format: `writer.py` writes it (`pipeline index`, every full build and update) and `reader.py` opens
it for search, memory-mapped; `reader.py`'s docstring lists its files."""
