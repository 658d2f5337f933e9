"""seqpar: measure sequence-parallel attention algorithms across many ranks."""

from seqpar.errors import SeqparError

__version__ = "0.1.0"
__all__ = ["SeqparError", "__version__"]
