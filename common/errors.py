class PipelineError(Exception):
    """A problem the user can fix (bad input, missing stage). The CLI prints it as one line and exits non-zero."""


class UnknownDocument(PipelineError):
    """A deletion names a document the store does not hold (the document API answers 404)."""
