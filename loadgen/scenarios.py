"""What each simulated user sends, and when: office, long-doc, burst, shared-prefix,
noisy-neighbour, code-edit, agent-turn.

Every user draws from its own seeded Random, so a run with the same seed sends the same
prompts and lengths whatever the server's timing (only *when* things happen varies).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field

from officellm.loadgen import text
from officellm.loadgen.budget import Budget
from officellm.loadgen.client import ChatClient, RequestRecord

SCENARIOS = ("office", "long-doc", "burst", "shared-prefix", "noisy-neighbour", "code-edit",
             "agent-turn")
CODE_SYSTEM = "You are a careful programming assistant. Reply with code only."
CHAT_SYSTEM = "You are a helpful office assistant. Answer clearly."


@dataclass
class ScenarioConfig:
    """The knobs of a scenario; defaults are an office's, tests shrink them."""

    name: str
    users: int
    seed: int = 0
    max_tokens: int = 128  # cap on a reply's length; replies draw below it
    think_time: float = 2.0  # mean seconds between a user's turns (exponential)
    doc_tokens: int = 6000  # long-doc: the pasted document, scaled down to fit the context
    prefix_tokens: int = 1000  # shared-prefix: the common system prompt
    max_context: int = 2048  # the server's context length (from /v1/models when it says)
    # noisy-neighbour: one heavy user keeps this many long-context requests in flight (each a
    # document of heavy_doc_tokens, answered in up to heavy_max_tokens) beside `users` light
    # users chatting as in office. 0 heavy requests: the light users alone; 0 users: the
    # heavy user alone.
    heavy_requests: int = 8
    heavy_doc_tokens: int = 4000
    heavy_max_tokens: int = 64
    # noisy-neighbour: seconds into the run before the heavy user sends its first documents
    # while light users are there (0: all start together, on a server that has seen nobody).
    heavy_start: float = 0.0
    file_tokens: int = 1200  # code-edit: the file each request asks to rewrite

    def __post_init__(self) -> None:
        if self.name not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.name!r}; one of {', '.join(SCENARIOS)}")
        if self.name == "noisy-neighbour":
            if self.users < 0 or self.heavy_requests < 0 or not self.users + self.heavy_requests:
                raise ValueError("noisy-neighbour needs light users or heavy requests (or both)")
            if self.max_tokens < 1 or self.heavy_max_tokens < 1:
                raise ValueError("max_tokens and heavy_max_tokens must be at least 1")
            if self.heavy_start < 0:
                raise ValueError("heavy_start must be at least 0 seconds")
        elif self.users < 1 or self.max_tokens < 1:
            raise ValueError("users and max_tokens must be at least 1")

    @property
    def heavy_user(self) -> int:
        """noisy-neighbour: the heavy user's index (after the light users' 0..users-1)."""
        return self.users

    def effective_doc_tokens(self) -> int:
        """The paste must fit: leave room for the reply and the chat template."""
        room = int(self.max_context * 0.85) - self.max_tokens - 64
        return max(64, min(self.doc_tokens, room))

    def effective_heavy_doc_tokens(self) -> int:
        """The heavy user's documents, scaled down to fit the context like the paste."""
        room = int(self.max_context * 0.85) - self.heavy_max_tokens - 64
        return max(64, min(self.heavy_doc_tokens, room))


@dataclass
class Run:
    """Shared state of one run: where records go and the long-doc signal."""

    client: ChatClient
    budget: Budget
    config: ScenarioConfig
    records: list[RequestRecord] = field(default_factory=list)
    chat_streaming: asyncio.Event = field(default_factory=asyncio.Event)

    def rng(self, user: int) -> random.Random:
        return random.Random(f"{self.config.seed}-{self.config.name}-{user}")

    def draw_max_tokens(self, rng: random.Random) -> int:
        """Log-normal reply lengths (most short, a few long), median half the cap."""
        cap = self.config.max_tokens
        value = int(rng.lognormvariate(math.log(max(1.0, cap / 2)), 0.5))
        return max(min(16, cap), min(cap, value))

    def think(self, rng: random.Random) -> float:
        return rng.expovariate(1.0 / self.config.think_time) if self.config.think_time > 0 else 0.0

    async def send(self, record: RequestRecord, messages: list[dict[str, str]]) -> RequestRecord:
        # Appended before sending, so a request cut off by the time limit is still reported.
        self.records.append(record)
        # A chat mid-answer is what long-doc's paste waits for: its first token, not its end.
        streaming = self.chat_streaming.set if record.kind == "chat" else None
        await self.client.chat(record, messages, on_first_token=streaming)
        return record


async def office_user(run: Run, user: int) -> None:
    """A multi-turn conversation that resends its whole history every turn, with think time."""
    rng = run.rng(user)
    await run.budget.sleep(rng.uniform(0, run.config.think_time))  # people do not start in step
    conversation, history = 0, [{"role": "system", "content": CHAT_SYSTEM}]
    used = 0  # tokens the history held at the last turn, from the server's usage
    while True:
        ask = text.question(rng)
        max_tokens = run.draw_max_tokens(rng)
        need = used + int(len(ask.split()) * text.TOKENS_PER_WORD) + 16 + max_tokens
        if len(history) > 1 and need > run.config.max_context * 0.9:
            # What docs/design.md §9 tells people on turn 40: start a new chat.
            conversation, history, used = conversation + 1, history[:1], 0
        if not run.budget.take():
            return
        history.append({"role": "user", "content": ask})
        rec = RequestRecord(user=user, turn=(len(history) - 2) // 2, kind="chat",
                            start=time.perf_counter(), max_tokens=max_tokens,
                            conversation=conversation)
        await run.send(rec, list(history))
        if rec.ok:
            history.append({"role": "assistant", "content": rec.text})
            used = (rec.prompt_tokens or 0) + (rec.completion_tokens or 0)
        else:
            history.pop()  # the turn failed: the user asks something else next time
        await run.budget.sleep(run.think(rng))


async def paste_user(run: Run, user: int) -> None:
    """Waits until the others are mid-answer, then pastes one long document (not budgeted:
    the paste is the point of the scenario)."""
    rng = run.rng(user)
    try:
        await asyncio.wait_for(run.chat_streaming.wait(), timeout=run.budget.remaining_time())
    except asyncio.TimeoutError:
        return
    if run.budget.exhausted():
        return
    messages = [{"role": "system", "content": CHAT_SYSTEM},
                {"role": "user", "content": text.document(rng, run.config.effective_doc_tokens())}]
    rec = RequestRecord(user=user, turn=0, kind="paste", start=time.perf_counter(),
                        max_tokens=run.config.max_tokens)
    await run.send(rec, messages)


async def burst_wave(run: Run, wave: int) -> None:
    """All users at once, short questions and short replies."""

    async def one(user: int) -> None:
        rng = random.Random(f"{run.config.seed}-burst-{wave}-{user}")
        if not run.budget.take():
            return
        rec = RequestRecord(user=user, turn=wave, kind="burst", start=time.perf_counter(),
                            max_tokens=max(1, run.draw_max_tokens(rng) // 2))
        await run.send(rec, [{"role": "user", "content": text.question(rng, 5, 20)}])

    await asyncio.gather(*(one(u) for u in range(run.config.users)))


async def burst(run: Run) -> None:
    wave, rng = 0, run.rng(-1)
    while not run.budget.exhausted():
        await burst_wave(run, wave)
        wave += 1
        await run.budget.sleep(run.think(rng))


async def shared_prefix_user(run: Run, user: int) -> None:
    """Single-turn questions behind the same long system prompt (what prefix caching is for)."""
    rng = run.rng(user)
    system = text.system_prompt(min(run.config.prefix_tokens,
                                    int(run.config.max_context * 0.6)), run.config.seed)
    turn = 0
    while run.budget.take():
        rec = RequestRecord(user=user, turn=turn, kind="shared-prefix", start=time.perf_counter(),
                            max_tokens=run.draw_max_tokens(rng))
        await run.send(rec, [{"role": "system", "content": system},
                             {"role": "user", "content": text.question(rng, 5, 30)}])
        turn += 1
        await run.budget.sleep(run.think(rng))


async def code_edit_user(run: Run, user: int) -> None:
    """A coding agent's edits: a file of about file_tokens in the prompt, a small change
    asked, the whole file back (as long as max_tokens allows); a new file each turn."""
    rng = run.rng(user)
    cfg = run.config
    file_tokens = max(64, min(cfg.file_tokens, int(cfg.max_context * 0.85) // 2 - 64))
    turn = 0
    while run.budget.take():
        rec = RequestRecord(user=user, turn=turn, kind="code-edit", start=time.perf_counter(),
                            max_tokens=min(cfg.max_tokens, file_tokens + 64))
        await run.send(rec, [{"role": "system", "content": CODE_SYSTEM},
                             {"role": "user", "content": text.code_edit(rng, file_tokens)}])
        turn += 1
        await run.budget.sleep(run.think(rng))


async def agent_turn_user(run: Run, user: int) -> None:
    """A coding agent's loop: the same long instructions for every agent (prefix_tokens:
    what the prefix cache is for), then turns of a tool's result and a short reply naming
    the next tool call; the conversation is resent whole every turn, and starts anew when
    it would outgrow the context."""
    rng = run.rng(user)
    cfg = run.config
    system = text.agent_instructions(min(cfg.prefix_tokens, int(cfg.max_context * 0.5)),
                                     cfg.seed)
    history = [{"role": "system", "content": system}]
    turn, used = 0, 0
    while run.budget.take():
        result = text.tool_result(rng, rng.randint(40, 200))
        if used + len(result.split()) * text.TOKENS_PER_WORD + 64 > cfg.max_context * 0.9:
            history, used = history[:1], 0
        history.append({"role": "user", "content": result})
        rec = RequestRecord(user=user, turn=turn, kind="agent-turn", start=time.perf_counter(),
                            max_tokens=min(cfg.max_tokens, 48))
        await run.send(rec, list(history))
        if rec.ok:
            history.append({"role": "assistant", "content": rec.text})
            used = (rec.prompt_tokens or 0) + (rec.completion_tokens or 0)
        else:
            history.pop()
        turn += 1
        await run.budget.sleep(run.think(rng))


async def heavy_slot(run: Run, slot: int) -> None:
    """One of the heavy user's parallel requests: a long document to summarise, sent again
    (a new document) as soon as the answer is in, until the run ends. Not budgeted by the
    request count while light users are there (the flood is the point of the scenario);
    alone, it takes from the budget like any user."""
    cfg = run.config
    rng = random.Random(f"{cfg.seed}-heavy-{slot}")
    turn = 0
    if cfg.users:  # alone, there is no office to join
        await run.budget.sleep(cfg.heavy_start)
    while not run.budget.exhausted():
        if cfg.users == 0 and not run.budget.take():
            return
        doc = text.document(rng, cfg.effective_heavy_doc_tokens())
        rec = RequestRecord(user=cfg.heavy_user, turn=turn, kind="heavy",
                            start=time.perf_counter(), max_tokens=cfg.heavy_max_tokens,
                            conversation=slot)
        await run.send(rec, [{"role": "system", "content": CHAT_SYSTEM},
                             {"role": "user", "content": doc}])
        turn += 1


async def noisy_neighbour(run: Run) -> None:
    """N light users chatting (office's users) while one heavy user floods."""
    cfg = run.config
    await asyncio.gather(*(office_user(run, u) for u in range(cfg.users)),
                         *(heavy_slot(run, k) for k in range(cfg.heavy_requests)))


async def play(run: Run) -> None:
    """Run the configured scenario until its budget is spent."""
    name, users = run.config.name, run.config.users
    if name == "office":
        await asyncio.gather(*(office_user(run, u) for u in range(users)))
    elif name == "long-doc":
        await asyncio.gather(*(office_user(run, u) for u in range(users)), paste_user(run, users))
    elif name == "burst":
        await burst(run)
    elif name == "noisy-neighbour":
        await noisy_neighbour(run)
    elif name == "code-edit":
        await asyncio.gather(*(code_edit_user(run, u) for u in range(users)))
    elif name == "agent-turn":
        await asyncio.gather(*(agent_turn_user(run, u) for u in range(users)))
    else:
        await asyncio.gather(*(shared_prefix_user(run, u) for u in range(users)))
