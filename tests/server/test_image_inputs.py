"""Images in chat, through the real app in-process and the real `openai` and `anthropic`
clients: Chat Completions' image_url parts, the Responses API's input_image parts and
Anthropic's image blocks reach a vision model (a tiny random Gemma 3 with its SigLIP tower)
as the engine's own LLM.generate takes them, and their tokens count in usage; every bad image
(truncated, 0x0, 20,000 x 20,000, a wrong MIME type, not an image, an http URL when URLs are
off, too many) is a 400 in its API's shape and the next request is served; with
--allow-image-urls an image is fetched from a local HTTP server within its size cap and
timeout; an image's tokens count against a person's context cap; Open WebUI's recorded image
requests are served; a model without vision refuses images by name.

One engine for the file: LLM.generate's reference answers come first, then the apps serve
from its engine (in-process, the real clients over Starlette's TestClient)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletionChunk
from PIL import Image

from officellm.app.chat.image_input import ImageLimits
from officellm.app.chat.image_parts import image_part, load_chat_images, text_part
from officellm.app.policy import thread_key
from officellm.app.server import create_app
from officellm.app.server_settings import ServerSettings
from officellm.cli import build_parser
from officellm.cli.serve import settings_from_args
from officellm.engine import (
    LLM,
    MultiModalPrompt,
    SamplingParams,
    load_multimodal_processor,
)
from officellm.engine.kv_plan import ALLOW_LONG_MAX_MODEL_LEN
from tests.support.openai_errors import anthropic_error, openai_error
from tests.support.tiny_models import build_tiny_gemma3_vision

GEMMA3_TEMPLATE = Path(__file__).parents[1] / "support" / "chat_templates" / "gemma3.jinja"
# Gemma 3's image tokens, added to SmolLM2's tokenizer so the tiny model's last three ids
# (its boi, eoi and image token: tiny_gemma3_multimodal_config) are them.
IMAGE_TOKENS = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
# A 16k window past the tiny model's trained 1,024 positions (OFFICELLM_ALLOW_LONG_MAX_MODEL_LEN,
# as tests/server/test_recorded_clients.py does): Open WebUI's recorded request describes its
# 28 built-in tools in thousands of tokens; what the model writes does not matter there.
ENGINE = dict(dtype="float32", quantization="none", kv_cache_dtype="float32",
              kv_cache_memory="128MiB", num_threads=1, max_model_len=16384)
RECORDED = Path(__file__).parent / "recorded"
DEFAULT_MAX_TOKENS = 3  # the apps', for requests that name none (Open WebUI's)
QUESTION = "What is in this picture?"
MAX_TOKENS = 4


def png(size: tuple[int, int] = (40, 32), seed: int = 1) -> bytes:
    """A small PNG of coloured noise (a different picture per seed)."""
    import random

    rng = random.Random(seed)
    image = Image.new("RGB", size)
    image.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256))
                   for _ in range(size[0] * size[1])])
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG's signature and header claiming `width` x `height`, and no pixels: what a
    decompression bomb or a 0x0 image looks like before decoding."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_chat(url: str, **extra: object) -> dict:
    """A chat completion body asking about the image at `url`."""
    return {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url, "detail": "high"}},
        {"type": "text", "text": QUESTION}]}],
        "max_tokens": MAX_TOKENS, "temperature": 0, **extra}


@pytest.fixture(scope="module")
def vision_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A tiny random Gemma 3 image-text checkpoint: SmolLM2's tokenizer with Gemma 3's image
    tokens, Gemma 3's chat template (images as <start_of_image>), its image processor."""
    from transformers import AutoTokenizer

    tokenizer_dir = tmp_path_factory.mktemp("gemma3-tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    tokenizer.add_tokens(IMAGE_TOKENS, special_tokens=True)
    tokenizer.save_pretrained(str(tokenizer_dir))
    out = build_tiny_gemma3_vision(tmp_path_factory.mktemp("gemma3-vision") / "model",
                                   tokenizer_dir)
    (out / "chat_template.jinja").write_text(GEMMA3_TEMPLATE.read_text())
    return out


@dataclass
class App:
    """The app in-process and the real clients pointed at it."""

    http: TestClient
    openai: openai.OpenAI
    anthropic: anthropic.Anthropic
    model: str
    admin: dict[str, str]


@dataclass(frozen=True)
class Expected:
    """LLM.generate's greedy answer to QUESTION about an image, and its prompt."""

    text: str
    token_ids: list[int]
    prompt: MultiModalPrompt


def expected(llm: LLM, vision_dir: Path, image: bytes, ignore_eos: bool) -> Expected:
    """The prompt rendered by transformers' tokenizer with Gemma 3's template, expanded by
    the engine's processor, and run by LLM.generate (greedy, MAX_TOKENS)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(vision_dir))
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": QUESTION}]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    processor = load_multimodal_processor(vision_dir)
    assert processor is not None
    prompt = processor.process(tokenizer.encode(text, add_special_tokens=False),
                               [Image.open(io.BytesIO(image)).convert("RGB")])
    [out] = llm.generate(multimodal=prompt, sampling_params=SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, ignore_eos=ignore_eos))
    return Expected(out.outputs[0].text, list(out.outputs[0].token_ids), prompt)


CHAT_IMAGE, ANTHROPIC_IMAGE = png(seed=1), png(seed=2)


@pytest.fixture(scope="module")
def engine(vision_dir: Path) -> Iterator[LLM]:
    """The engine's own LLM on the checkpoint, loaded once: the reference answers come from
    it first, then the apps serve from its engine."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(ALLOW_LONG_MAX_MODEL_LEN, "1")
        llm = LLM(str(vision_dir), **ENGINE)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def reference(engine: LLM, vision_dir: Path) -> dict[str, Expected]:
    """What the server must answer, from LLM.generate before any app drives the engine."""
    return {"chat": expected(engine, vision_dir, CHAT_IMAGE, ignore_eos=True),
            "anthropic": expected(engine, vision_dir, ANTHROPIC_IMAGE, ignore_eos=False)}


@contextmanager
def serving(engine: LLM, tmp_path: Path, **image_settings: object) -> Iterator[App]:
    """The app serving `engine` to a user with a key, with `image_settings` (ServerSettings'
    image knobs)."""
    settings = ServerSettings(admin_remote=True, database=str(tmp_path / "officellm.db"),
                              default_max_tokens=DEFAULT_MAX_TOKENS, **image_settings)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OFFICELLM_DATA_DIR", str(tmp_path))  # the admin token's place
        app = create_app(settings, lambda: engine.llm_engine)
        admin = {"Authorization":
                 f"Bearer {next(tmp_path.rglob('admin_token')).read_text().strip()}"}
        with TestClient(app) as http:
            server = app.state.server
            assert server.default_model.async_engine.wait_ready(120)
            assert http.post("/admin/users", json={"name": "ada"},
                             headers=admin).status_code == 201
            key = http.post("/admin/keys", json={"user": "ada"}, headers=admin).json()["key"]
            http.headers["Authorization"] = f"Bearer {key}"
            yield App(http,
                      openai.OpenAI(base_url="http://testserver/v1", api_key=key,
                                    http_client=http, max_retries=0),
                      anthropic.Anthropic(base_url="http://testserver", api_key=key,
                                          http_client=http, max_retries=0),
                      server.model_name, admin)


@pytest.fixture(scope="module")
def app(engine: LLM, reference: dict[str, Expected],
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """Image URLs off (the default)."""
    with serving(engine, tmp_path_factory.mktemp("app")) as served:
        yield served


def usage_images(app: App) -> int:
    r = app.http.get("/admin/usage", params={"by": "user"}, headers=app.admin)
    assert r.status_code == 200, r.text
    return sum(row["images"] for row in r.json()["rows"])


# -- the answers ------------------------------------------------------------------------------

def test_a_chat_with_an_image_answers_the_engines_tokens_and_counts_its_tokens(
        app: App, reference: dict[str, Expected]) -> None:
    want = reference["chat"]
    images_before = usage_images(app)
    answer = app.openai.chat.completions.create(
        model=app.model, **image_chat(data_uri(CHAT_IMAGE)), extra_body={"ignore_eos": True})
    assert answer.choices[0].message.content == want.text
    # The image's tokens are prompt tokens: the prompt as expanded, image tokens included.
    assert answer.usage.prompt_tokens == len(want.prompt.token_ids)
    assert answer.usage.completion_tokens == len(want.token_ids)
    assert usage_images(app) == images_before + 1


def test_an_anthropic_image_block_answers_the_engines_tokens(
        app: App, reference: dict[str, Expected]) -> None:
    want = reference["anthropic"]
    asked = [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(ANTHROPIC_IMAGE).decode()}},
        {"type": "text", "text": QUESTION}]}]
    # The SDK no longer sends temperature (Anthropic's newer models take none); the API and
    # this server do: greedy goes in the body.
    message = app.anthropic.messages.create(model=app.model, max_tokens=MAX_TOKENS,
                                            extra_body={"temperature": 0}, messages=asked)
    assert "".join(block.text for block in message.content) == want.text
    assert message.usage.output_tokens == len(want.token_ids)
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == len(
        want.prompt.token_ids)
    counted = app.anthropic.messages.count_tokens(model=app.model, messages=asked)
    assert counted.input_tokens == len(want.prompt.token_ids)


def test_a_responses_input_image_is_read_as_the_chats(app: App) -> None:
    image = png(seed=3)
    chat = app.openai.chat.completions.create(model=app.model, **image_chat(data_uri(image)))
    response = app.openai.responses.create(
        model=app.model, max_output_tokens=MAX_TOKENS, temperature=0, input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": data_uri(image),
                                          "detail": "auto"},
                                         {"type": "input_text", "text": QUESTION}]}])
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.output_text == chat.choices[0].message.content


def replay(app: App, name: str) -> list[str]:
    """A recorded request (tests/server/recorded/), sent as recorded but for the model's
    name and the key: the data lines of its stream."""
    record = json.loads((RECORDED / name).read_text())
    body = {**record["body"], "model": app.model}
    with app.http.stream("POST", record["path"], json=body) as r:
        assert r.status_code == 200, r.read()
        return [line.removeprefix("data: ") for line in r.iter_lines()
                if line.startswith("data: ")]


def test_open_webuis_recorded_image_chat_is_served(app: App) -> None:
    """Its screenshot inlined as a data URI after an <attached_files> text part, its 28
    built-in tools, no max_tokens: streamed to [DONE], the image's tokens in the prompt."""
    lines = replay(app, "open_webui_0.12.4_image_chat.json")
    assert lines[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(line) for line in lines[:-1]]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finish in (["stop"], ["length"], ["tool_calls"])


def test_open_webuis_recorded_image_responses_request_is_served(app: App) -> None:
    """The same message through the Responses API: an input_image part (a string
    image_url, detail auto) after two input_text parts; streamed to its last event (cut
    by the server's default max_tokens: incomplete, for max_output_tokens)."""
    events = [json.loads(line) for line in replay(app, "open_webui_0.12.4_image_responses.json")]
    last = events[-1]
    assert last["type"] in ("response.completed", "response.incomplete")
    if last["type"] == "response.incomplete":
        assert last["response"]["incomplete_details"]["reason"] == "max_output_tokens"
    usage = last["response"]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] <= DEFAULT_MAX_TOKENS


def test_tokenize_counts_an_images_tokens_as_the_chat_does(app: App) -> None:
    body = image_chat(data_uri(png(seed=4)))
    chat = app.http.post("/v1/chat/completions", json=body).json()
    r = app.http.post("/tokenize", json={"messages": body["messages"]})
    assert r.status_code == 200, r.text
    assert r.json()["count"] == chat["usage"]["prompt_tokens"]


def test_an_images_tokens_count_against_the_persons_context_cap(app: App) -> None:
    text_only = [{"role": "user", "content": QUESTION}]
    with_image = image_chat(GOOD)["messages"]
    text_tokens = app.http.post("/tokenize", json={"messages": text_only}).json()["count"]
    image_tokens = app.http.post("/tokenize", json={"messages": with_image}).json()["count"]
    assert image_tokens > text_tokens + 2
    cap = {"max_context_tokens": text_tokens + 2, "on_limit": "reject"}
    assert app.http.put("/admin/policies/users/ada", json=cap,
                        headers=app.admin).status_code == 200
    try:
        error = openai_error(app.http.post("/v1/chat/completions", json=image_chat(GOOD)), 400)
        assert f"over your limit of {text_tokens + 2}" in error["message"]
        r = app.http.post("/v1/chat/completions", json={"messages": text_only, "max_tokens": 1})
        assert r.status_code == 200, r.text
    finally:
        app.http.delete("/admin/policies/users/ada", headers=app.admin)


def test_an_image_after_a_tool_result_stays_an_image_on_a_template_without_tools(
        app: App) -> None:
    """Gemma 3's template renders no tool turns: results become user text, and the user's
    image that follows them must stay an image part, not text."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "screenshot", "arguments": "{}"}}
    body = {"messages": [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Taken."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": GOOD}},
                                     {"type": "text", "text": QUESTION}]}],
        "max_tokens": 1}
    r = app.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


def test_a_thread_knows_an_image_by_its_picture_never_its_bytes() -> None:
    """The same picture as PNG and as lossless WebP opens the same thread, and the messages
    the thread is hashed from hold no image data."""
    webp = io.BytesIO()
    Image.open(io.BytesIO(CHAT_IMAGE)).save(webp, "WEBP", lossless=True)

    def opening(url: str) -> list[dict]:
        asked = [{"role": "user", "content": [image_part(url), text_part(QUESTION)]}]
        loaded, _ = asyncio.run(load_chat_images(asked, ServerSettings().image_limits,
                                                 vision=True, model="m"))
        return loaded

    as_png, as_webp = opening(data_uri(CHAT_IMAGE)), opening(data_uri(webp.getvalue(),
                                                                      "image/webp"))
    assert thread_key(1, as_png) == thread_key(1, as_webp)
    assert "base64" not in json.dumps(as_png)


def test_the_image_flags_set_the_image_limits() -> None:
    args = build_parser().parse_args([
        "serve", "--allow-image-urls", "--image-fetch-max-bytes", "1000",
        "--image-fetch-timeout", "2.5", "--max-images-per-request", "3",
        "--max-image-pixels", "4096"])
    settings, _ = settings_from_args(args)
    assert settings.image_limits == ImageLimits(max_images=3, max_pixels=4096, allow_urls=True,
                                                fetch_max_bytes=1000, fetch_timeout_s=2.5)
    default, _ = settings_from_args(build_parser().parse_args(["serve"]))
    assert not default.image_limits.allow_urls


# -- bad images: a 400 in the API's shape, and the next request is served --------------------

GOOD = data_uri(png(seed=5))
BAD_IMAGES = {
    "truncated": (data_uri(png()[:200]), "truncated or corrupt"),
    "zero-by-zero": (data_uri(png_header(0, 0)), "0x0"),
    "20000-by-20000": (data_uri(png_header(20_000, 20_000)), "pixels"),
    "gif": (data_uri(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", "image/gif"),
            "Image type 'image/gif' is not supported"),
    "png-sent-as-jpeg": (data_uri(png(), "image/jpeg"), "its bytes are PNG"),
    "not-an-image": (data_uri(b"%PDF-1.7 a memo", "image/png"), "not a readable"),
    "empty": (data_uri(b""), "empty"),
    "not-base64": ("data:image/png;base64,@@@", "not valid base64"),
    "http-url-when-off": ("http://127.0.0.1:9/screenshot.png", "--allow-image-urls"),
}


@pytest.mark.parametrize("url, says", BAD_IMAGES.values(), ids=BAD_IMAGES.keys())
def test_a_bad_image_is_a_400_saying_why_and_the_next_chat_is_served(
        app: App, url: str, says: str) -> None:
    error = openai_error(app.http.post("/v1/chat/completions", json=image_chat(url)), 400)
    assert says in error["message"] and error["param"] == "messages"
    assert app.http.post("/v1/chat/completions", json=image_chat(GOOD)).status_code == 200


def test_a_bad_image_block_is_a_400_in_anthropics_shape(app: App) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png()[:200]).decode()}}
    body = {"model": app.model, "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": [image]}]}
    message = anthropic_error(app.http.post("/v1/messages", json=body), 400,
                              "invalid_request_error")
    assert "truncated or corrupt" in message
    with pytest.raises(anthropic.BadRequestError, match="allow-image-urls"):
        app.anthropic.messages.create(model=app.model, max_tokens=MAX_TOKENS, messages=[
            {"role": "user", "content": [{"type": "image", "source": {
                "type": "url", "url": "https://example.com/scan.png"}}]}])


def test_more_images_than_the_cap_are_refused(app: App) -> None:
    parts = [{"type": "image_url", "image_url": {"url": GOOD}}] * 9
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 1}
    error = openai_error(app.http.post("/v1/chat/completions", json=body), 400)
    assert "9 images; at most 8" in error["message"]


def test_an_image_in_an_assistant_message_is_refused(app: App) -> None:
    body = {"messages": [
        {"role": "user", "content": "Draw."},
        {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": GOOD}}]},
        {"role": "user", "content": "Again."}], "max_tokens": 1}
    error = openai_error(app.http.post("/v1/chat/completions", json=body), 400)
    assert "user messages only" in error["message"]


# -- image URLs, when the admin allows them ----------------------------------------------------

SLOW_S = 3.0


class _Images(BaseHTTPRequestHandler):
    """/ok.png: a PNG; /big.png: more bytes than the fetch cap; /slow.png: an answer that
    takes SLOW_S; /missing.png: 404."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/missing.png":
            self.send_error(404)
            return
        body = png(seed=6) if self.path != "/big.png" else png((200, 200), seed=7)
        if self.path == "/slow.png":
            time.sleep(SLOW_S)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        try:
            self.wfile.write(body)
        except BrokenPipeError:  # /slow.png: the server gave up first, as it should
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def images_site() -> Iterator[str]:
    """A local HTTP server holding images (127.0.0.1, a free port)."""
    site = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{site.server_address[1]}"
    site.shutdown()
    site.server_close()


@pytest.fixture(scope="module")
def url_app(app: App, engine: LLM,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """Image URLs on, at most 40 kB and 1 s a fetch: a second app on the same engine."""
    with serving(engine, tmp_path_factory.mktemp("url-app"), allow_image_urls=True,
                 image_fetch_max_bytes=40_000, image_fetch_timeout=1.0) as served:
        yield served


def test_an_allowed_image_url_is_fetched_and_read_as_its_data_uri(
        url_app: App, images_site: str) -> None:
    by_url = url_app.http.post("/v1/chat/completions",
                               json=image_chat(f"{images_site}/ok.png"))
    inline = url_app.http.post("/v1/chat/completions", json=image_chat(data_uri(png(seed=6))))
    assert by_url.status_code == 200, by_url.text
    assert by_url.json()["choices"] == inline.json()["choices"]


@pytest.mark.parametrize("path, says", [("/big.png", "over 40000 bytes"),
                                        ("/slow.png", "longer than 1 s"),
                                        ("/missing.png", "HTTP 404")],
                         ids=["over-the-size-cap", "over-the-timeout", "not-found"])
def test_an_image_url_past_its_limits_is_a_400(url_app: App, images_site: str, path: str,
                                              says: str) -> None:
    t0 = time.monotonic()
    error = openai_error(url_app.http.post("/v1/chat/completions",
                                           json=image_chat(images_site + path)), 400)
    assert says in error["message"]
    assert time.monotonic() - t0 < SLOW_S
    assert url_app.http.post("/v1/chat/completions", json=image_chat(GOOD)).status_code == 200


# -- a model without vision ---------------------------------------------------------------------

def test_a_model_without_vision_refuses_an_image_naming_itself(client: openai.OpenAI,
                                                               model: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, **image_chat(GOOD))
    assert f"Model {model!r} has no vision" in refused.value.body["message"]
