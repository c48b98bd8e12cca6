"""The typed manifest (common/manifest.py): it reads what workspaces hold, writes it back unchanged, and
answers whether the parts belong together."""

import json

import pytest

from common.errors import PipelineError
from common.manifest import (
    EmbedderEntry,
    IndexEntry,
    SearchEntry,
    read_json,
    read_manifest,
    write_section,
)
from common.workspace import Workspace

# An index section as `pipeline index` wrote it before this module: fields other code reads, and figures it reports.
OLD_INDEX = {
    "path": "index/faiss-1.index",
    "type": "flat",
    "vectors": 10,
    "embedder_fingerprint": "abc",
    "embedder_chunking": [64, 8],
    "store_generation": 3,
    "build_seconds": 0.5,
    "reason": "exact",
    "lexical_path": "index/lexical-1",
}


def test_a_section_is_read_and_written_back_as_it_was(tmp_path):
    ws = Workspace(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"index": OLD_INDEX, "unknown_section": {"kept": True}}))
    entry = read_manifest(ws).index
    assert entry.vectors == 10 and entry.report == {"build_seconds": 0.5, "reason": "exact"}
    assert entry.delta_path is None and entry.analyzer is None and entry.language == "en"  # fields added since
    write_section(ws, entry)
    written = read_json(ws)
    assert written["unknown_section"] == {"kept": True}
    assert {k: v for k, v in written["index"].items() if k in OLD_INDEX} == OLD_INDEX


def test_a_section_missing_what_other_code_reads_is_a_one_line_error(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"index": {k: v for k, v in OLD_INDEX.items() if k != "path"}}))
    with pytest.raises(PipelineError, match="the index section has no 'path'"):
        read_manifest(Workspace(tmp_path))


def test_the_staleness_checks():
    index = IndexEntry.from_json(OLD_INDEX)
    embedder = EmbedderEntry(model_path="tuned", fingerprint="abc", dim=16, chunk_tokens=64, overlap=8)
    assert index.built_by(embedder)
    assert not index.built_by(EmbedderEntry(model_path="tuned", fingerprint="abc", dim=16, chunk_tokens=32, overlap=8))
    assert not index.built_by(EmbedderEntry(model_path="tuned", fingerprint="xyz", dim=16, chunk_tokens=64, overlap=8))
    assert "run `pipeline index`" in index.stale_reason(3)  # built before the corpus snapshot search reads
    index = IndexEntry.from_json({**OLD_INDEX, "corpus_path": "index/corpus-1"})
    assert index.stale_reason(3) is None
    assert "store generation 4, index built from 3" in index.stale_reason(4)
    assert SearchEntry(default_mode="hybrid", embedder_fingerprint="abc").measured_for(index)
    assert not SearchEntry(default_mode="hybrid", embedder_fingerprint="xyz").measured_for(index)


def test_a_corrupt_manifest_is_named(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(PipelineError, match="manifest.json: corrupt manifest"):
        read_manifest(Workspace(tmp_path))
