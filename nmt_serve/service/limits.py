"""Every limit the API process holds a request to, in one place, before the engine sees it: how many
texts, how many characters and tokens each, and the decoding options' bounds (settings.py names them).

The engine checks the rest on its side of the process boundary, once per call (engine/core.py,
`EngineCore.screen`): the deadline, the queue, admission by predicted work and each model's own
length limit. A refusal here is a 400, 413 or 422 in the service's one error shape (errors.py).
"""
from __future__ import annotations

from collections.abc import Callable

from nmt_serve.engine.protocol import DecodeOptions
from nmt_serve.service.errors import APIError, bad_request, too_large
from nmt_serve.service.settings import Settings


def unpaired_surrogate(value) -> str | None:
    """Where a text (or any string in a list or dict of them) is not valid Unicode, said in words; None when
    it is. JSON's escapes can carry half of a surrogate pair ("\\ud83d") that no UTF-8 can encode: the
    segmenter, the tokenizer and the response's encoder would each fail on it.

    Walked with a stack of its own, not by recursion: LibreTranslate's parameters are whatever JSON a
    client sent, and lists nested some hundreds deep (which json.loads takes) would exhaust Python's
    recursion limit here, a 500 where the request deserves a 400."""
    pending = [value]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            if value.isascii():
                continue
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"is not valid Unicode: an unpaired surrogate (U+{ord(value[exc.start]):04X}) at character {exc.start}"
        elif isinstance(value, (list, tuple)):
            pending.extend(reversed(value))  # the first element is looked at first
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                pending += (item, key)
    return None


class RequestLimits:
    def __init__(self, settings: Settings):
        self.settings = settings

    def check_texts(self, texts: list[str], param: str = "text") -> None:
        """The limits known before tokenizing: how many texts, how many characters each."""
        s = self.settings
        if not texts:
            raise bad_request("the list of texts is empty", param)
        if len(texts) > s.max_texts_per_request:
            raise too_large(f"{len(texts)} texts in one request; the limit is {s.max_texts_per_request}", param)
        for i, text in enumerate(texts):
            if len(text) > s.max_chars_per_text:
                raise too_large(f"text {i} has {len(text)} characters; the limit is {s.max_chars_per_text}", param)

    def check_file(self, text: str, param: str = "file") -> None:
        limit = self.settings.max_chars_per_text
        if len(text) > limit:
            raise too_large(f"the file has {len(text)} characters; the limit is {limit} (max_chars_per_text)", param)

    def check_file_bytes(self, size: int, param: str = "file", setting: str = "max_file_bytes") -> None:
        """An uploaded file's size: translated in the request (max_file_bytes) or as a job (max_job_bytes)."""
        limit = getattr(self.settings, setting)
        if size > limit:
            raise too_large(f"the file has {size} bytes; the limit is {limit} ({setting})", param)

    def check_document(self, paragraphs: list[str], param: str = "file") -> None:
        """A document's translatable text, all its paragraphs together (each one is then a text)."""
        chars, limit = sum(len(p) for p in paragraphs), self.settings.max_document_chars
        if chars > limit:
            raise too_large(f"the document has {chars} characters of text; the limit is {limit} (max_document_chars)", param)

    def check_job_texts(self, texts: list[str], param: str = "q") -> None:
        """A job's texts: how many, how many characters each (max_texts_per_request does not apply)."""
        s = self.settings
        if len(texts) > s.max_job_texts:
            raise too_large(f"{len(texts)} texts in one job; the limit is {s.max_job_texts} (max_job_texts)", param)
        for i, text in enumerate(texts):
            if len(text) > s.max_chars_per_text:
                raise too_large(f"text {i} has {len(text)} characters; the limit is {s.max_chars_per_text} (max_chars_per_text)", param)

    def check_tokens(self, index: int, tokens: int, param: str = "text") -> None:
        """A text's tokens, all its sentences together."""
        if tokens > self.settings.max_tokens_per_text:
            raise too_large(f"text {index} has {tokens} tokens; the limit is {self.settings.max_tokens_per_text}", param)

    def encode(self, encode: Callable[[str], list[int]], texts: list[str], param: str = "text") -> list[list[int]]:
        """Texts sent whole (no segmentation): checked, then each text's source ids (eos excluded)."""
        self.check_texts(texts, param)
        sources = []
        for i, text in enumerate(texts):
            ids = encode(text)
            self.check_tokens(i, len(ids), param)
            sources.append(ids)
        return sources

    def decode_options(self, beam_size: int, num_hypotheses: int, max_length: int | None, length_penalty: float = 1.0,
                       return_scores: bool = False) -> DecodeOptions:
        s = self.settings
        if max(beam_size, num_hypotheses) > s.max_beam_size:
            name = "beam_size" if beam_size >= num_hypotheses else "num_hypotheses"
            raise APIError(422, "validation_error", f"{name} must be at most {s.max_beam_size}", name)
        beam_size = max(beam_size, num_hypotheses)  # an n-best list longer than the beam widens the beam to it
        if max_length is not None and max_length > s.max_output_length:
            raise APIError(422, "validation_error", f"max_length must be at most {s.max_output_length}", "max_length")
        return DecodeOptions(beam_size, num_hypotheses, max_length, length_penalty, return_scores)
