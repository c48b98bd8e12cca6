"""Search stage: embed a query with the index's model, search FAISS, return ranked documents."""
