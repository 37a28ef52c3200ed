"""Cut very long documents into newline-aligned pieces so that tokenisers see bounded inputs."""

from __future__ import annotations

from collections.abc import Iterator

MAX_PIECE_CHARS = 1_000_000


def pieces(text: str, max_chars: int = MAX_PIECE_CHARS) -> Iterator[str]:
    """Consecutive pieces of `text` of at most `max_chars`, each ending after a newline where one exists.

    Their concatenation is `text`. Tokens never span two pieces, so for BPE a document longer
    than `max_chars` may tokenise slightly differently than in one call (a few tokens per piece).
    """
    start = 0
    while len(text) - start > max_chars:
        end = text.rfind("\n", start, start + max_chars) + 1
        if end <= start:
            end = start + max_chars
        yield text[start:end]
        start = end
    yield text[start:]
