class PipelineError(Exception):
    """A problem the user can fix (bad input, missing stage). The CLI prints it as one line and exits non-zero."""


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
