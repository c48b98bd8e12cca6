"""Index stage: a FAISS index over the stored chunk vectors."""
