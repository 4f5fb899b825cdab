"""Bounded decompression (`events.compression`): kombu's decoders, replaced, inflate
zlib, bzip2 and lzma bodies up to the limit and refuse what they cannot bound."""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from collections.abc import Callable

import pytest
from kombu import compression

from events.compression import BOUNDED, bound_decompression

LIMIT = 1000

CODECS: list[tuple[str, Callable[[bytes], bytes]]] = [
    ("application/x-gzip", zlib.compress),
    ("application/x-gzip", gzip.compress),  # a gzip file's stream, as other languages write
    ("application/x-bz2", bz2.compress),
    ("application/x-lzma", lzma.compress),
]
IDS = ["zlib", "gzip", "bzip2", "lzma"]


@pytest.fixture(autouse=True)
def own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's own copy of kombu's decoders, with one codec that cannot be bounded."""
    decoders = dict(compression._decoders)
    decoders["application/x-unboundable"] = lambda body: body
    monkeypatch.setattr(compression, "_decoders", decoders)
    bound_decompression(LIMIT)


@pytest.mark.parametrize(("content_type", "compress"), CODECS, ids=IDS)
def test_a_body_within_the_limit_inflates_as_before(
    content_type: str, compress: Callable[[bytes], bytes]
) -> None:
    for size in (0, 1, LIMIT):
        data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        assert compression.decompress(compress(data), content_type) == data


@pytest.mark.parametrize(("content_type", "compress"), CODECS, ids=IDS)
def test_a_body_past_the_limit_is_refused_without_inflating_it(
    content_type: str, compress: Callable[[bytes], bytes]
) -> None:
    with pytest.raises(ValueError, match=f"inflates to more than {LIMIT} bytes"):
        compression.decompress(compress(b"\0" * (LIMIT + 1)), content_type)
    with pytest.raises(ValueError, match=f"inflates to more than {LIMIT} bytes"):
        compression.decompress(compress(b"\0" * 50_000_000), content_type)  # 50 MB


@pytest.mark.parametrize(("content_type", "compress"), CODECS, ids=IDS)
def test_a_truncated_or_padded_body_is_refused(
    content_type: str, compress: Callable[[bytes], bytes]
) -> None:
    packed = compress(b"a decision" * 20)
    with pytest.raises(ValueError, match="incomplete or truncated"):
        compression.decompress(packed[: len(packed) // 2], content_type)
    with pytest.raises(ValueError, match="data after its end"):
        compression.decompress(packed + b"more", content_type)


def test_a_codec_that_cannot_be_bounded_is_refused() -> None:
    assert set(BOUNDED) <= set(compression._decoders)
    with pytest.raises(ValueError, match="'application/x-unboundable' is not accepted"):
        compression.decompress(b"anything", "application/x-unboundable")


def test_encoders_are_kept() -> None:
    packed, content_type = compression.compress(b"x" * 10, "zlib")
    assert content_type == "application/x-gzip"
    assert compression.decompress(packed, content_type) == b"x" * 10
