"""The dense index: FAISS files over the stored vectors, owned here from choosing a type to reading them back.

    index_types.py  which FAISS index a collection gets, how each is made, and its search width tuned
    ivf.py          the IVF family built in bounded memory (trained on a sample, filled in slices)
    files.py        writing an index file
    reader.py       reading the files as search uses them, and re-scoring approximate candidates

index/ orchestrates them (a full build, an update, shards) and names the files in the manifest; search/ reads
them through reader.py.
"""
