"""The lexical (BM25) index over the stored chunks: analysed by the collection's language, written to disk
as it is built, memory-mapped when loaded, and searched with dynamic pruning (exact top n).

Shared by the stages that rank text lexically: `pipeline index` builds it and writes it into the
workspace (index/build.py names and swaps its versioned directory), search and the default-mode
measurement query it, and `pipeline tune` mines hard negatives with it before any index exists. It is
in common/ because three stages use it and no stage imports another; what only `pipeline index` does
(where the files go, when older versions are removed) is in index/build.py.

Analysis. Each chunk is indexed as its document's title followed by the chunk text (what the dense side
embeds too), analysed by the collection's Analyzer: lower-cased, split into words (bm25s's word pattern)
and runs of Chinese, Japanese or Korean characters into overlapping bigrams (as Lucene's CJK analyzer
does), the language's stop words removed and its Snowball stemmer applied. The language is detected by
`pipeline index` on a sample of the chunks (common/language.py) or given by the user (`--language`), and
written with the index, so queries are analysed exactly as the chunks were. For English these are bm25s's
tokens (its word pattern and stop words), made without its per-call set-up, which was most of a query's
tokenizing (50 us of 56).

What is stored. Not BM25 scores, which depend on the whole collection (the number of chunks, each term's
document frequency, the average length), so that one chunk's arrival or departure would change them all:
each chunk's term counts and length, in segments. The base is written by a full build, and a delta holds
the chunks added since (index/update.py); base chunks the store no longer holds are skipped (tombstones).
BM25 (Lucene's variant, as bm25s: k1 = 1.5, b = 0.75) is computed at query time from the live chunks'
statistics, so an updated index scores every chunk exactly as one built from scratch over the same chunks.

Layout. An index directory holds segment-0/ (the base), segment-1/ (a delta, after an update), the live
chunk ids (chunk_ids.npy: position -> chunk id), the live chunks' document frequency of every term
(document_frequencies.npy: written with the index, since finding which terms the deleted chunks held
takes a pass over the postings) and the analyzer (tokenizer.json). A segment holds, for its rows (chunks,
in chunk id order): chunk_ids, lengths (tokens), and by term, in the ids of the vocabulary that this
segment and the ones before it grew (segment.json lists the terms it added): its postings
rows[indptr[t]:indptr[t + 1]] (int32 rows, ascending) with their term frequencies in tfs (uint16, a
count above 65,535 counted as that), in blocks of BLOCK postings (block_indptr[t] onwards), each with its
highest tf / (tf + norm) at the segment's own average length (block_max). All arrays are memory-mapped
on loading: what loading computes is per chunk (norms, live positions) and per term (idf), never per
posting. An index directory of an older layout (without document_frequencies.npy and segment.json) is
refused with "run `pipeline index`", which builds this one.

Building in bounded memory. Rows arrive in batches (Store.iter_chunk_rows); each is analysed, and every
SLICE_TOKENS tokens the analysed rows become a slice (term-major, as a segment) written to disk. The
slices are then merged into one segment a range of terms at a time (about MERGE_POSTINGS postings): a
term's postings are its slices' runs one after the other, already in row order. What the build holds is
the vocabulary, a few arrays per chunk, one slice and one range of postings, whatever the collection's size.

Searching: the exact top n without scoring every posting (MaxScore, document at a time, compiled with
numba: kernel.py's max_score). A query term's contribution to a chunk is idf * tf / (tf + norm) (times the number of
query words that are the term). A block's maximum bounds it for every chunk of the block: norms under the
live statistics are at least those at the segment's own average length times r = min(1, own average /
live average), so tf / (tf + norm) <= u / (u + r (1 - u)) for the block's maximum u; a term's bound is its
best block's. The terms are ordered by bound; the rows of the postings are visited in order, and once n
rows are found, the first terms whose bounds sum below the n-th best score ("non-essential": the most
common terms, which hold most postings) are no longer walked: they are looked up (galloping, then binary
search) only for the rows the others hold, and only while a row can still reach that score. A row's
score is its query words' float32 contributions added into float64 in query order, as the exhaustive sum
scores it; rows are ranked by score, ties by position. It replaced a numpy version (block-wise candidates,
then lookups for them) with the same rankings at about half the CPU at p50
(benchmarks/results/2026-11-28-scale-cpu.md); a first threshold from the best blocks and skipping by block
bounds were tried and cost more than they saved. A filter (weights of 1.0 for allowed positions, 0
otherwise) lets only allowed chunks in, so it prunes less. Each segment is searched with the threshold
the ones before it reached, and their results merged. Bounds and thresholds allow for float rounding
(SLACK).

A walk budget bounds the cost where exact BM25's grows with the collection (a query with several common
words walks millions of postings at 10M chunks): the terms of lowest bound are non-essential from the start,
as many as leave at most `walk_budget` postings to walk (the term of highest bound is always walked). A
chunk holding only those terms is then not found; every chunk found is scored exactly. Hybrid search uses
it (search/engine.py), where BM25 is one of two retrievers; lexical search stays exact.

The modules: analysis.py (the Analyzer, chosen by language), bm25.py (the formula), segment.py (a segment:
built, written in bounded memory, loaded), kernel.py (one segment's exact top n), index.py (LexicalIndex
over the segments, its files, searching many queries at once, the statistics shards sum).
"""

from common.lexical.analysis import LANGUAGE_SAMPLE_CHUNKS, Analyzer, check_language, choose_analyzer
from common.lexical.bm25 import K1, B
from common.lexical.index import CollectionStatistics, LexicalIndex
from common.lexical.segment import Segment

__all__ = [
    "LANGUAGE_SAMPLE_CHUNKS",
    "Analyzer",
    "check_language",
    "choose_analyzer",
    "B",
    "K1",
    "CollectionStatistics",
    "LexicalIndex",
    "Segment",
]
