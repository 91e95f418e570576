"""Text primitives shared by the data stages: bytes to text, text to sentences and to words."""

from __future__ import annotations

import codecs
import re
import unicodedata

_PARAGRAPHS = re.compile(r"\n\s*\n")  # a blank line ends a paragraph; single newlines are wrapping
# blingfire reads a whole paragraph at once and needs ~25 bytes per character of it: 1.3 GB for a
# 50 MB line (a dump, minified data) with no blank line in it. A paragraph longer than this is
# split in pieces of this size (_split_long: ~25 MB each). Real paragraphs are far shorter (the
# longest in the packaged corpora has 28,000 characters): their sentences are as they always were.
PIECE_CHARS = 1_000_000
# The last sentence of a piece, which its end may have cut short, is split again with the next
# piece (on the packaged corpora cut every 700 characters this finds the sentences of the whole
# paragraph but for 1 cut in 10,000); a "sentence" longer than this (minified data: no sentence
# end) is not, but joined from its parts: one sentence, too long for clean.max_sentence_chars.
_MAX_CARRY_CHARS = 100_000
# Words of raw text for token and span tasks: runs of letters/digits (with inner - ' ’ .), or
# one other non-space character, the way CoNLL splits "U.S.-led" or "(Reuters)".
WORD = re.compile(r"\w+(?:[-'’.]\w+)*|[^\w\s]")
_SPACES = re.compile(r"\s{2,}|[^\S ]")  # the whitespace that " ".join(s.split()) changes
# UTF-32's little-endian BOM begins with UTF-16's: the longer ones are tried first.
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
              (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def decode_bytes(data: bytes, fallback: str) -> tuple[str | None, str]:
    """Bytes -> (text, status): status is ok, fallback (not UTF-8), empty or binary."""
    if not data.strip():
        return None, "empty"
    if wide := wide_encoding(data):  # UTF-16/32 text is full of NUL bytes: known by its BOM
        codec, bom = wide
        try:
            return data[bom:].decode(codec), "ok"
        except UnicodeDecodeError:
            return None, "binary"
    if b"\x00" in data:
        return None, "binary"
    try:
        text, status = data.decode("utf-8-sig"), "ok"
    except UnicodeDecodeError:
        text, status = utf8_or_fallback(data.removeprefix(codecs.BOM_UTF8), fallback)[0], "fallback"
    # Binary data without NUL bytes still decodes to mostly control characters.
    head = text[:65536]
    controls = sum(1 for ch in head if unicodedata.category(ch) == "Cc" and ch not in "\n\r\t")
    if controls > 0.05 * len(head):
        return None, "binary"
    return text, status


def utf8_or_fallback(raw: bytes, fallback: str) -> tuple[str, bool]:
    """Bytes as text: UTF-8, each byte that is not UTF-8 as `fallback` (latin-1 where that fails
    too); and whether any byte needed the fallback."""
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        # Byte by byte, not the whole text: a UTF-8 file with a few stray bytes (a cut copy, one
        # pasted Latin-1 line) keeps the rest as written, instead of every é in it becoming Ã©.
        return raw.decode("utf-8", errors=_fallback_errors(fallback)), True


def _fallback_errors(fallback: str) -> str:
    """The name of a decoding error handler that reads the bytes UTF-8 cannot as `fallback`."""
    name = f"bertflow-fallback-{fallback}"
    try:
        codecs.lookup_error(name)
    except LookupError:
        def handle(e: UnicodeError) -> tuple[str, int]:
            bad = e.object[e.start:e.end]
            try:
                return bad.decode(fallback), e.end
            except (UnicodeDecodeError, LookupError):
                return bad.decode("latin-1"), e.end  # decodes any byte string
        codecs.register_error(name, handle)
    return name


def wide_encoding(head: bytes) -> tuple[str, int] | None:
    """(codec, BOM length) of UTF-16/32 text starting with `head`, known by its BOM; else None."""
    return next(((codec, len(bom)) for bom, codec in _WIDE_BOMS if head.startswith(bom)), None)


def split_sentences(text: str) -> list[str]:
    """Paragraphs (blank lines) first, then sentences within each paragraph (blingfire).

    A single line break is line wrapping (mail, Gutenberg, 72-column text), not a boundary.
    """
    out = []
    for paragraph in _PARAGRAPHS.split(text):
        if len(paragraph) > PIECE_CHARS:
            out.extend(_split_long(paragraph))
            continue
        paragraph = " ".join(paragraph.split())
        if paragraph:
            out.extend(_sentences(paragraph))
    return [s for s in out if s]


def _sentences(paragraph: str) -> list[str]:
    import blingfire

    return [s.strip() for s in blingfire.text_to_sentences(paragraph).split("\n")]


def _split_long(paragraph: str) -> list[str]:
    """The sentences of a paragraph longer than PIECE_CHARS, from pieces of it cut at spaces."""
    # " ".join(paragraph.split()) without a list of every word (60 bytes each: 0.5 GB for 50 MB)
    text = _SPACES.sub(" ", paragraph).strip()
    out: list[str] = []
    carry = ""  # the last sentence of the previous piece, split again with this one
    long: list[str] = []  # the parts so far of a sentence longer than _MAX_CARRY_CHARS
    glue = ""  # what stood between the previous piece and this one: " ", or "" in a cut word
    start = 0
    while start < len(text):
        end, next_glue = min(start + PIECE_CHARS, len(text)), ""
        if end < len(text) and (space := text.rfind(" ", start, end + 1)) > start:
            end, next_glue = space, " "
        piece = text[start:end]
        start = end + len(next_glue)
        sentences = [s for s in _sentences(carry + glue + piece if carry else piece) if s]
        if long and sentences:  # the piece begins inside the long sentence, which ends where
            long += [glue, sentences.pop(0)]  # another sentence begins
            if sentences:
                out.append("".join(long))
                long = []
        carry, glue = "", next_glue
        if sentences and start < len(text):  # the last sentence may go on in the next piece
            last = sentences.pop()  # blingfire keeps every character: the end of the chunk
            if len(last) <= _MAX_CARRY_CHARS:
                carry = last
            else:
                long = [last]
        out.extend(sentences)
    if long:
        out.append("".join(long))
    return out


def split_words(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Words of raw text and their character offsets."""
    matches = list(WORD.finditer(text))
    return [m.group() for m in matches], [m.span() for m in matches]
