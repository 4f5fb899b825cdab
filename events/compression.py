"""Bounded decompression for consumers of untrusted messages.

kombu inflates a message whose headers name a `compression` (its own feature, on any
transport) while it builds the message, before any consumer code sees it, and with no
limit: a small message can inflate to gigabytes in memory. `bound_decompression(limit)`
replaces kombu's decoders, for the process, with ones that stop once the output would
pass `limit` bytes and then raise, so the message is refused like any other that cannot
be read (kombu hands the error to the consumer's `on_decode_error`). zlib (`gzip`:
kombu's own zlib stream, or a gzip file's, as other languages' gzip functions write
it), bzip2 and lzma (`xz`) are inflated up to the limit; a codec that cannot be bounded here
(brotli, zstd, where installed) is refused. Encoders are kept: publishing compressed
messages works as before.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from typing import Any

from kombu import compression

__all__ = ["BOUNDED", "bound_decompression"]

BOUNDED = ("application/x-gzip", "application/x-bz2", "application/x-lzma")
"""kombu's content types of the codecs inflated up to the limit."""


def _bounded(make: Callable[[], Any], name: str, limit: int) -> Callable[[bytes], bytes]:
    def decode(body: bytes) -> bytes:
        inflater = make()  # zlib's, bzip2's and lzma's incremental decompressors alike
        out = inflater.decompress(bytes(body), limit + 1)  # at most limit + 1 bytes
        if len(out) > limit:
            raise ValueError(f"the {name} body inflates to more than {limit} bytes")
        if not inflater.eof:
            raise ValueError(f"the {name} body is incomplete or truncated")
        if inflater.unused_data:
            raise ValueError(f"the {name} body has data after its end")
        return bytes(out)

    return decode


def _refused(content_type: str) -> Callable[[bytes], bytes]:
    def decode(_body: bytes) -> bytes:
        raise ValueError(
            f"compression {content_type!r} is not accepted here: send the body as it is, "
            "or compressed with zlib, bzip2 or lzma"
        )

    return decode


def _zlib_or_gzip() -> Any:
    """An inflater of a zlib stream (kombu's `application/x-gzip`) or of a gzip file's
    (Node's `gzipSync`, Go's `gzip.Writer`, Python's `gzip.compress`), told by its
    header."""
    return zlib.decompressobj(wbits=32 + zlib.MAX_WBITS)


def bound_decompression(limit: int) -> None:
    """Make kombu, in this process, inflate no message body past `limit` bytes (see the
    module's docstring). Idempotent; the last limit given applies."""
    makers: dict[str, tuple[Callable[[], Any], str]] = {
        "application/x-gzip": (_zlib_or_gzip, "zlib"),
        "application/x-bz2": (bz2.BZ2Decompressor, "bzip2"),
        "application/x-lzma": (lzma.LZMADecompressor, "lzma"),
    }
    registry: dict[str, Callable[[bytes], bytes]] = compression._decoders
    for content_type in list(registry):
        if content_type in makers:
            make, name = makers[content_type]
            registry[content_type] = _bounded(make, name, limit)
        else:
            registry[content_type] = _refused(content_type)
