class PipelineError(Exception):
    """A problem the user can fix (bad input, missing stage). The CLI prints it as one line and exits non-zero."""


class StoredNotIndexed(PipelineError):
    """A document write was committed to the store, and the index update after it failed: the documents are
    kept, and searchable once the index is updated (the server does it when it starts: workflows.serve)."""


class UnknownDocument(PipelineError):
    """A deletion names a document the store does not hold (the document API answers 404)."""


def out_of_memory_error(error: BaseException) -> str | None:
    """One line for an accelerator's out-of-memory error (torch's, or CUDA's own as a RuntimeError) saying
    what to lower; None for any other error."""
    import sys

    torch = sys.modules.get("torch")  # only a command that loaded torch can have run out of its memory
    if torch is None:
        return None
    text = str(error)
    if not (
        isinstance(error, torch.OutOfMemoryError)
        or (isinstance(error, RuntimeError) and "out of memory" in text and ("CUDA" in text or "HIP" in text))
    ):
        return None
    first = (text.strip().splitlines() or [type(error).__name__])[0].split(". ")[0]
    return (
        f"the GPU ran out of memory ({first}): lower --batch-size (and --mini-batch in tune), give a smaller model "
        "(--preset, --n-layer/--n-embd), or free the GPU (nvidia-smi lists the processes holding its memory)"
    )


def disk_full_error(error: BaseException) -> str | None:
    """One line for a write that found the disk (or the user's quota) full, anywhere in the error's chain (a
    failed rollback after it is what DuckDB raises last); None for any other error."""
    import errno

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        full = isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
        if full or "No space left on device" in str(error):
            where = f" writing {error.filename}" if isinstance(error, OSError) and error.filename else ""
            return (
                f"no space left on the device{where}: free space there (or move the workspace), then run the "
                "command again"
            )
        error = error.__cause__ or error.__context__
    return None
