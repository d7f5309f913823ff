"""An image a client sent, as a validated RGB picture: a data URI decoded, or (when the admin
allows it, `--allow-image-urls`) an http(s) URL fetched with a size cap and a time limit.

Every way an image can be wrong is an ImageInputError (a ValueError: the route answers a 400
in its API's shape) with a sentence the client can act on: a MIME type other than PNG, JPEG
or WebP, bytes that are not that format (or no image at all), an empty or 0x0 picture, one
over the pixel cap (refused from its header, before its pixels are decoded: a 20,000 x
20,000 PNG of a few kilobytes must not become 1.2 GB of RGB), a truncated file, a URL when
URLs are off, a fetch that is too big, too slow or fails.

Nothing of the image is kept: the bytes live for the request, and what identifies the image
anywhere else (a thread's opening, app/policy/thread_identity.py) is `content_hash`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import warnings
from dataclasses import dataclass

import httpx
from PIL import Image, UnidentifiedImageError
from starlette.concurrency import run_in_threadpool

# The engine's error for an image it cannot take: one type for every image refusal, the
# server's (here) and the model's processor's, each a 400 with its sentence.
from officellm.engine import ImageInputError

# The formats accepted: MIME type -> Pillow's name for it. GIF (animated), BMP, TIFF and
# the rest are refused: no vision model's processor here reads frames, and a screenshot or
# a scan comes as one of these three.
SUPPORTED_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP"}
_MIME_LIST = "image/png, image/jpeg or image/webp"


@dataclass(frozen=True)
class ImageLimits:
    """What a request's images may be (ServerSettings' image knobs, docs/configuration.md)."""

    max_images: int  # images in one request
    max_pixels: int  # width x height of one image, read from its header
    allow_urls: bool  # http(s) image URLs fetched by the server
    fetch_max_bytes: int  # the most bytes one fetch reads
    fetch_timeout_s: float  # the most one fetch takes, in all


def content_hash(image: Image.Image) -> str:
    """sha256 of the decoded picture (size and RGB pixels): the same picture re-encoded or
    re-sent hashes equal, and the hash says nothing of its content."""
    h = hashlib.sha256(f"{image.width}x{image.height}:".encode())
    h.update(image.tobytes())
    return h.hexdigest()


def parse_data_uri(uri: str) -> tuple[str, bytes]:
    """The MIME type and bytes of a `data:<mime>;base64,<data>` URI."""
    header, sep, payload = uri.partition(",")
    if not sep or not header.startswith("data:") or not header.endswith(";base64"):
        raise ImageInputError("An image data URI is written data:<mime type>;base64,<data>.")
    mime = header[len("data:"):-len(";base64")].strip().lower()
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError("The image data URI's data is not valid base64.") from None
    return mime, data


def decode_image(data: bytes, mime: str, limits: ImageLimits) -> Image.Image:
    """The RGB picture of `data`, which its sender says is `mime`."""
    expected = SUPPORTED_FORMATS.get(mime)
    if expected is None:
        raise ImageInputError(f"Image type {mime or 'none'!r} is not supported: send "
                              f"{_MIME_LIST}.")
    if not data:
        raise ImageInputError("The image is empty (no bytes).")
    try:
        with warnings.catch_warnings():
            # Pillow warns past its own bomb threshold and raises past twice it; the cap
            # below is this server's rule, checked on the header either way.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError:
        raise ImageInputError(_too_large_message(None, limits)) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise ImageInputError(f"The image's bytes are not a readable {_MIME_LIST} image (no "
                              "image, an empty 0x0 one, or a corrupt header).") from None
    if image.format != expected:
        raise ImageInputError(f"The image is sent as {mime} but its bytes are "
                              f"{image.format or 'of another format'}: send the image's "
                              "own MIME type.")
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageInputError(f"The image is {width}x{height}: it has no pixels.")
    if width * height > limits.max_pixels:
        raise ImageInputError(_too_large_message(image.size, limits))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        raise ImageInputError("The image is truncated or corrupt: its pixels could not be "
                              "decoded.") from None
    return image.convert("RGB")


def _too_large_message(size: tuple[int, int] | None, limits: ImageLimits) -> str:
    # No size: Pillow's own guard refused the header first (over twice its MAX_IMAGE_PIXELS).
    what = (f"is {size[0]}x{size[1]} pixels" if size else
            f"claims over {2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels in its header")
    return (f"The image {what}: at most {limits.max_pixels} pixels (width x height) are "
            "accepted; scale it down.")


async def fetch_image(url: str, limits: ImageLimits) -> tuple[str, bytes]:
    """The MIME type (the response's Content-Type) and bytes of an http(s) image URL, read
    as a stream and given up past `fetch_max_bytes` or `fetch_timeout_s` in all."""
    if not limits.allow_urls:
        raise ImageInputError("Image URLs are not fetched by this server: send the image as "
                              "a data URI (data:image/png;base64,...), or ask its admin to "
                              "start it with --allow-image-urls.")
    try:
        async with httpx.AsyncClient(timeout=limits.fetch_timeout_s,
                                     follow_redirects=True) as client:
            return await _read_capped(client, url, limits)
    except httpx.TimeoutException:
        raise ImageInputError(f"Fetching the image URL took longer than "
                              f"{limits.fetch_timeout_s:g} s.") from None
    except httpx.HTTPError as exc:
        raise ImageInputError(f"The image URL could not be fetched: {exc}") from None


async def _read_capped(client: httpx.AsyncClient, url: str,
                       limits: ImageLimits) -> tuple[str, bytes]:
    # The overall deadline: httpx's timeout is per read, not per response.
    async def read() -> tuple[str, bytes]:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise ImageInputError(f"The image URL answered HTTP {response.status_code}.")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > limits.fetch_max_bytes:
                    raise ImageInputError(f"The image at the URL is over "
                                          f"{limits.fetch_max_bytes} bytes, the most this "
                                          "server fetches.")
            mime = response.headers.get("content-type", "").split(";")[0].strip().lower()
            return mime, bytes(body)

    try:
        return await asyncio.wait_for(read(), limits.fetch_timeout_s)
    except asyncio.TimeoutError:
        raise httpx.TimeoutException("deadline") from None


async def load_image(url: str, limits: ImageLimits) -> Image.Image:
    """The RGB picture an image reference names: a data URI, or an http(s) URL (when
    allowed). ImageInputError for anything else or anything wrong with it."""
    if url.startswith("data:"):
        mime, data = parse_data_uri(url)
    elif url.startswith(("http://", "https://")):
        mime, data = await fetch_image(url, limits)
    else:
        raise ImageInputError("An image is a data URI (data:image/png;base64,...) or an "
                              "http(s) URL.")
    # Decoding a large picture takes milliseconds to seconds: off the event loop.
    return await run_in_threadpool(decode_image, data, mime, limits)
