"""One SSE event per chunk, whatever text the model generates (app/openai/sse.py)."""

from __future__ import annotations

import json

import httpx
from pydantic import BaseModel

from officellm.app.openai.sse import sse

# Legal raw in a JSON string, but line ends to str.splitlines() (and so to httpx's aiter_lines).
SPLITLINES_BREAKS = "\x85\u2028\u2029"


class Delta(BaseModel):
    content: str


def test_an_event_stays_one_line_when_the_text_holds_unicode_line_separators() -> None:
    text = f"a{SPLITLINES_BREAKS[0]}b{SPLITLINES_BREAKS[1]}c{SPLITLINES_BREAKS[2]}d\ne\rf"
    event = sse(Delta(content=text))
    lines = event.splitlines()
    assert lines == [lines[0], ""] and lines[0].startswith("data: ")
    assert json.loads(lines[0].removeprefix("data: ")) == {"content": text}


def test_httpx_line_iteration_reads_the_event_whole() -> None:
    event = sse(Delta(content=f"x{SPLITLINES_BREAKS}y"))
    response = httpx.Response(200, content=event.encode())
    (line,) = [line for line in response.iter_lines() if line]
    assert json.loads(line.removeprefix("data: "))["content"] == f"x{SPLITLINES_BREAKS}y"
