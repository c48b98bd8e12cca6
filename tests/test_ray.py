"""Ray paths on a throw-away local Ray cluster (slow to start: few, bounded tests)."""
import json

import numpy as np
import pytest

from common.store import Store
from common.workspace import Workspace
from conftest import run_cli

pytest.importorskip("ray", reason="the ray extra is not installed")


def test_ray_embedded_vectors_equal_single_process_ones(trained_workspace, tmp_path, corpus_file):
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(corpus_file.read_text().splitlines()[:30]) + "\n")
    stores = {}
    for name, extra in (("single", []), ("ray", ["--ray", "local"])):
        ws = Workspace(tmp_path / name).create()
        run_cli("embed", "-w", str(ws.root), "--data", str(data), "--model", str(trained_workspace / "model"),
                "--chunk-tokens", "48", "--overlap", "8", *extra, timeout=400)
        with Store(ws.db_path, read_only=True) as store:
            chunks = store.con.execute("SELECT chunk_id, doc_id, chunk_index, text FROM chunks ORDER BY chunk_id").fetchall()
            stores[name] = (chunks, *store.load_vectors())
    (chunks_1, ids_1, vectors_1), (chunks_r, ids_r, vectors_r) = stores["single"], stores["ray"]
    assert chunks_1 == chunks_r and len(chunks_1) > 30
    np.testing.assert_array_equal(ids_1, ids_r)
    np.testing.assert_allclose(vectors_r, vectors_1, atol=1e-5)
