"""`pipeline status`: what the workspace holds and whether its parts belong together."""
from __future__ import annotations

from common.errors import PipelineError
from common.store import Store, stale_index_message
from common.workspace import Workspace, file_sha256, model_fingerprint


def workspace_status(ws: Workspace) -> dict:
    if not ws.manifest_path.exists():
        raise PipelineError(f"no workspace at {ws.root} (no {ws.manifest_path.name}): `pipeline pretrain` "
                            "or `pipeline embed --model DIR` makes one")
    manifest = ws.read_manifest()
    parts: dict[str, dict] = {}
    problems: list[str] = []

    tok = manifest.get("tokenizer")
    if tok:
        path = ws.tokenizer_dir / "tokenizer.json"
        ok = path.exists() and file_sha256(path) == tok["sha256"]
        parts["tokenizer"] = {"state": "ok" if ok else "changed", "detail": f"{tok['vocab_size']} tokens, trained on {tok['documents']} documents"}
        if not ok:
            problems.append(f"{path} differs from the tokenizer recorded in the manifest")
    else:
        parts["tokenizer"] = {"state": "missing", "detail": "run `pipeline pretrain`"}

    model = manifest.get("model")
    if model:
        current = model_fingerprint(ws.model_dir) if ws.model_dir.exists() else None
        ok = current == model["fingerprint"]
        parts["model"] = {"state": "ok" if ok else "changed", "detail": f"{model['preset']} preset, {model['parameters'] / 1e6:.1f}M parameters, {model['steps']} steps, id {model['fingerprint']}"}
        if not ok:
            problems.append(f"{ws.model_dir} differs from the model recorded in the manifest")
    else:
        parts["model"] = {"state": "missing", "detail": "run `pipeline pretrain`"}

    tuned = manifest.get("tuned")
    if tuned:
        detail = (f"{tuned.get('architecture', 'transformer')} embedder, {tuned['steps']} steps, "
                  f"loss {tuned['first_loss'] or 0:.3f} -> {tuned['final_loss']:.3f}, id {tuned['fingerprint']}")
        if not (ws.root / tuned["path"]).exists():
            parts["tuned"] = {"state": "missing", "detail": f"{ws.root / tuned['path']} is gone: run `pipeline tune`"}
        elif model and tuned["base_fingerprint"] != model["fingerprint"]:
            # Not a fault: embed then uses the pretrained model (and says so).
            parts["tuned"] = {"state": "stale", "detail": f"{detail}; tuned from an older pretrained model: run `pipeline tune`"}
        else:
            parts["tuned"] = {"state": "ok", "detail": detail}
    else:
        parts["tuned"] = {"state": "none", "detail": "optional: `pipeline tune` makes a better embedder"}

    emb = manifest.get("embedder")
    counts = {"documents": 0, "chunks": 0, "vectors": 0}
    generation = None
    if emb and ws.db_path.exists():
        with Store(ws.db_path, read_only=True) as store:
            counts = store.counts()
            generation = store.generation()
        model_dir = ws.embedder_model_dir(emb)
        current = model_fingerprint(model_dir) if model_dir.exists() else None
        state = "ok" if current == emb["fingerprint"] else "stale"
        parts["vectors"] = {"state": state, "detail": f"{counts['documents']} documents, {counts['chunks']} chunks, {counts['vectors']} vectors from model {emb['fingerprint']} ({model_dir})"}
        if state != "ok":
            problems.append(f"the stored vectors were made by model {emb['fingerprint']}, but {model_dir} is now {current}: run `pipeline embed`")
    else:
        parts["vectors"] = {"state": "missing", "detail": "run `pipeline embed`"}

    idx = manifest.get("index")
    if idx:
        files = [idx["path"]] + ([idx["delta_path"]] if idx.get("delta_path") else [])
        missing = [path for path in files if not (ws.root / path).exists()]
        state = "ok"
        if missing:
            state = "missing"
            problems.append(f"{ws.root / missing[0]} is missing: run `pipeline index`")
        elif emb and idx["embedder_fingerprint"] != emb["fingerprint"]:
            state = "stale"
            problems.append("the index was built from another model's vectors: run `pipeline index`")
        elif idx.get("store_generation") != generation:
            state = "stale"
            problems.append(stale_index_message(idx.get("store_generation"), generation))
        language = (idx.get("analyzer") or {}).get("language", "en")
        lexical = f", BM25 lexical index ({language})" if idx.get("lexical_path") else ", no lexical index"
        delta = f" ({idx['delta_vectors']} in the delta, {idx['deleted_in_base']} deleted from the base)" if idx.get("delta_vectors") or idx.get("deleted_in_base") else ""
        parts["index"] = {"state": state, "detail": f"{idx['type']}, {idx['vectors']} vectors{delta}{lexical}"}
        measured = manifest.get("search", {})
        if measured.get("embedder_fingerprint") == idx["embedder_fingerprint"]:
            weight = f", dense weight {measured['dense_weight']}" if measured.get("default_mode") == "hybrid" and "dense_weight" in measured else ""
            parts["search"] = {"state": "ok", "detail": f"default mode {measured['default_mode']}{weight} (chosen on {measured.get('chosen_by', 'judged queries')})"}
        else:
            parts["search"] = {"state": "default", "detail": "default mode lexical; `pipeline index` or `pipeline eval --mode all --set-default` measures the best"}
    else:
        parts["index"] = {"state": "missing", "detail": "run `pipeline index`"}
    return {"workspace": str(ws.root), "parts": parts, "problems": problems}
