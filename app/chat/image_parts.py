"""Images inside chat-template messages: how the three APIs' image parts reach the chat
template, and how a request's images are loaded once, before anything else reads the
messages.

The protocols (app/openai/protocol.py, app/openai/responses_protocol.py,
app/anthropic/protocol.py) turn their image parts into `image_part(url)`; a message holding
one keeps its content as a list of parts ({"type": "text", "text"} and {"type": "image"}, as
Hugging Face chat templates take them), a text-only message stays one string as before.
`load_chat_images` then checks the model reads images and the count cap, loads each image
(app/chat/image_input.py) and puts its content hash in the part in place of its URL: from
there on (thread identity, the template, truncation) no message holds the image's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PIL import Image

from officellm.app.chat.image_input import ImageInputError, ImageLimits, content_hash, load_image

Message = dict[str, Any]

IMAGE = "image"  # the part type chat templates render as the model's image marker


def image_part(url: str) -> dict[str, Any]:
    """A message part for the image at `url` (a data URI or an http(s) URL)."""
    return {"type": IMAGE, "url": url}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def part_content(parts: list[dict[str, Any]], joiner: str) -> str | list[dict[str, Any]]:
    """A message's content from its parts: their texts joined by `joiner` (one string, as
    every text-only message is) when none is an image, else the parts themselves."""
    if any(p["type"] == IMAGE for p in parts):
        return parts
    return joiner.join(p["text"] for p in parts)


def _image_parts(message: Message) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [p for p in content if isinstance(p, dict) and p.get("type") == IMAGE]


def count_images(messages: list[Message]) -> int:
    """How many images the messages hold."""
    return sum(len(_image_parts(m)) for m in messages)


@dataclass(frozen=True)
class ChatImages:
    """A request's loaded images, by content hash (one entry for a picture sent twice)."""

    by_hash: dict[str, Image.Image]
    count: int  # image parts in the request, repeats included

    def in_order(self, messages: list[Message]) -> list[Image.Image]:
        """The pictures of `messages`' image parts, in prompt order (after truncation,
        those of the turns kept)."""
        return [self.by_hash[p["hash"]] for m in messages for p in _image_parts(m)]


async def load_chat_images(messages: list[Message], limits: ImageLimits, vision: bool,
                           model: str) -> tuple[list[Message], ChatImages | None]:
    """The messages with each image part's URL replaced by its picture's content hash, and
    the pictures (None: no image). ImageInputError (a 400) for an image on a model without
    vision, too many, one outside a user message, or one that cannot be loaded."""
    count = count_images(messages)
    if count == 0:
        return messages, None
    if not vision:
        raise ImageInputError(f"Model {model!r} has no vision: it reads text only. Send the "
                              "request without images, or to a vision model.")
    if count > limits.max_images:
        raise ImageInputError(f"The request has {count} images; at most {limits.max_images} "
                              "are accepted in one request.")
    by_hash: dict[str, Image.Image] = {}
    out: list[Message] = []
    for message in messages:
        if not _image_parts(message):
            out.append(message)
            continue
        if message.get("role") != "user":
            raise ImageInputError(f"Images are read in user messages only, not in a "
                                  f"{message.get('role')!r} message.")
        parts = []
        for part in message["content"]:
            if part.get("type") == IMAGE:
                image = await load_image(part["url"], limits)
                digest = content_hash(image)
                by_hash.setdefault(digest, image)
                part = {"type": IMAGE, "hash": digest}
            parts.append(part)
        out.append({**message, "content": parts})
    return out, ChatImages(by_hash, count)
