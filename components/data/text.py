"""Text primitives shared by the data stages: bytes to text, and text to sentences."""

from __future__ import annotations

import codecs
import re
import unicodedata

_PARAGRAPHS = re.compile(r"\n\s*\n")  # a blank line ends a paragraph; single newlines are wrapping
# UTF-32's little-endian BOM begins with UTF-16's: the longer ones are tried first.
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
              (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def decode_bytes(data: bytes, fallback: str) -> tuple[str | None, str]:
    """Bytes -> (text, status): status is ok, fallback (not UTF-8), empty or binary."""
    if not data.strip():
        return None, "empty"
    for bom, codec in _WIDE_BOMS:  # UTF-16/32 text is full of NUL bytes: known by its BOM
        if data.startswith(bom):
            try:
                return data[len(bom):].decode(codec), "ok"
            except UnicodeDecodeError:
                return None, "binary"
    if b"\x00" in data:
        return None, "binary"
    try:
        text, status = data.decode("utf-8-sig"), "ok"
    except UnicodeDecodeError:
        try:
            text = data.decode(fallback)
        except (UnicodeDecodeError, LookupError):
            text = data.decode("latin-1")  # decodes any byte string
        status = "fallback"
    # Binary data without NUL bytes still decodes to mostly control characters.
    head = text[:65536]
    controls = sum(1 for ch in head if unicodedata.category(ch) == "Cc" and ch not in "\n\r\t")
    if controls > 0.05 * len(head):
        return None, "binary"
    return text, status


def split_sentences(text: str) -> list[str]:
    """Paragraphs (blank lines) first, then sentences within each paragraph (blingfire).

    A single line break is line wrapping (mail, Gutenberg, 72-column text), not a boundary.
    """
    import blingfire

    out = []
    for paragraph in _PARAGRAPHS.split(text):
        paragraph = " ".join(paragraph.split())
        if paragraph:
            out.extend(s.strip() for s in blingfire.text_to_sentences(paragraph).split("\n"))
    return [s for s in out if s]
