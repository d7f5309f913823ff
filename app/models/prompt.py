"""The prompt, once: rendered off the engine's thread, every length rule decided in one place.

A chat request's messages are rendered with the model's chat template exactly once (truncation
re-renders only the shorter lists it tries); a completion's text is tokenized once. Then
`decide_length` applies, in this order, every rule on the prompt's length, each with its own
sentence from one source:
  1. the user's thread limits (max_context_tokens, max_turns) with their on_limit: reject
     (400), notify (a normal reply saying so), truncate (drop the oldest turns that fit);
     app.policy.evaluate, sentences in app.policy.messages;
  2. the model's max_model_len, in vLLM's words (engine.input_processor): the prompt must
     leave room for one token; a max_tokens past the window is not refused but clamped to
     the room left (generation stops at the window, finish_reason "length"), as clients that
     always send a large max_tokens (Anthropic's, agents) expect;
  3. the server's --max-context-tokens, always a refusal (app.policy.messages).
The engine then receives token ids. A chat with images (app/chat/image_parts.py) is rendered
with the model's image marker in place of each, and the engine's MultiModalProcessor expands
every marker to the image's tokens: all three rules count the expanded prompt, so an image
costs its tokens against the caps and the quota like text; the engine receives the
MultiModalPrompt.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

from officellm.app.admission.admission import Admission
from officellm.app.admission.decision_error import decision_error
from officellm.app.chat.image_parts import ChatImages
from officellm.app.errors import APIError
from officellm.app.observability.refusals import Refusals
from officellm.app.policy import (
    ChatThread,
    Decision,
    EffectivePolicy,
    background_task_policy,
    context_limit_message,
    count_turns,
    evaluate,
)
from officellm.engine import (
    InputProcessor,
    MultiModalProcessor,
    MultiModalPrompt,
    PromptTooLongError,
    apply_chat_template,
    load_multimodal_processor,
    load_tokenizer,
)

Message = dict[str, Any]

# Why a prompt was refused, for officellm:refusals_total (the policy's own reasons are
# counted by Refusals.policy).
MODEL_LENGTH, SERVER_CAP, INVALID = "context_length", "context_cap", "invalid_request"

# Any ordinary text: with_special_tokens reads off it what the tokenizer adds around a text.
_PROBE = "Hello world"


class PromptRenderer:
    """The served model's tokenizer and chat template, for worker threads.

    The engine's tokenizer belongs to the event loop's output processing (a Rust tokenizer
    used from two threads at once can fail with "Already borrowed"), so prompts have their
    own copy, used by one worker thread at a time.
    """

    def __init__(self, model_dir: Path, vision: bool = False) -> None:
        self._tokenizer = load_tokenizer(model_dir)
        # A vision model's image preprocessing and marker expansion (None: no vision), on
        # this tokenizer: like it, used by one worker thread at a time.
        self._processor: MultiModalProcessor | None = (
            load_multimodal_processor(model_dir, self._tokenizer) if vision else None)
        self._lock = threading.Lock()
        self._special: tuple[list[int], list[int]] | None = None  # with_special_tokens'

    def render(self, messages: list[Message], add_generation_prompt: bool,
               template_kwargs: dict[str, Any]) -> list[int]:
        """Token ids of a conversation (blocking). ValueError when the template refuses the
        messages: the client's error."""
        with self._lock:
            try:
                return apply_chat_template(self._tokenizer, messages, add_generation_prompt, **template_kwargs)
            except Exception as exc:  # jinja errors (e.g. roles out of order) are the client's
                raise ValueError(
                    f"The chat template could not render these messages: {exc}") from exc

    def expand(self, token_ids: list[int], images: list[Any]) -> MultiModalPrompt:
        """A rendered prompt with each image marker expanded to its image's tokens, the
        images preprocessed as the model's processor does it (blocking). ValueError
        (ImageInputError) for images the processor cannot take, or a count of markers the
        template wrote that is not the count of images."""
        assert self._processor is not None, "only a vision model's messages hold images"
        with self._lock:
            return self._processor.process(token_ids, images)

    def render_chat(self, messages: list[Message], add_generation_prompt: bool,
                    template_kwargs: dict[str, Any], images: ChatImages | None
                    ) -> tuple[list[int], MultiModalPrompt | None]:
        """The prompt of a conversation (blocking): its token ids, and with images among
        the messages their MultiModalPrompt (whose token_ids are the ids returned)."""
        ids = self.render(messages, add_generation_prompt, template_kwargs)
        pictures = images.in_order(messages) if images is not None else []
        if not pictures:
            return ids, None
        prompt = self.expand(ids, pictures)
        return prompt.token_ids, prompt

    def encode(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        """Token ids of a completion prompt (blocking); `add_special_tokens` as transformers'
        (a completion always adds them; /tokenize may be asked not to)."""
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        with self._lock:
            return self._tokenizer.encode(prompt, add_special_tokens=add_special_tokens)

    def with_special_tokens(self, token_ids: list[int]) -> list[int]:
        """`token_ids` with the special tokens the tokenizer adds around one text (a BOS, an
        EOS, or none), as encoding their text with them would give: /tokenize's
        `add_special_tokens` for a chat already rendered, without rendering it again."""
        with self._lock:
            if self._special is None:
                self._special = self._find_special_tokens()
            before, after = self._special
        return before + token_ids + after

    def _find_special_tokens(self) -> tuple[list[int], list[int]]:
        # The tokenizer's template for one sequence, read off a probe encoded both ways:
        # transformers has no one call that adds special tokens to ids, for every tokenizer.
        bare = self._tokenizer.encode(_PROBE, add_special_tokens=False)
        full = self._tokenizer.encode(_PROBE, add_special_tokens=True)
        for start in range(len(full) - len(bare) + 1):
            if full[start:start + len(bare)] == bare:
                return full[:start], full[start + len(bare):]
        raise ValueError("This model's tokenizer changes a text's own tokens when it adds its "
                         "special tokens; send add_special_tokens false with messages.")

    def token_strs(self, token_ids: list[int]) -> list[str]:
        """Each token's string in the vocabulary (byte-level pieces as they are, e.g. "Ġthe"),
        as vLLM's /tokenize returns them (blocking)."""
        with self._lock:
            return list(self._tokenizer.convert_ids_to_tokens(token_ids))

    @property
    def vocab_size(self) -> int:
        """How many token ids the tokenizer knows, its added tokens included."""
        return len(self._tokenizer)

    def decode(self, token_ids: list[int]) -> str:
        """The text of token ids, special tokens included (blocking). The caller checks they
        are in the vocabulary: transformers turns an unknown id into nothing, silently."""
        with self._lock:
            return self._tokenizer.decode(token_ids)


class _MeasuredMessages:
    """The token counter app.policy.evaluate calls, remembering the ids of each message list
    it rendered, so the list finally chosen is not rendered again."""

    def __init__(self, renderer: PromptRenderer, add_generation_prompt: bool,
                 template_kwargs: dict[str, Any], images: ChatImages | None = None) -> None:
        self._renderer = renderer
        self._args = (add_generation_prompt, template_kwargs, images)
        # Keyed by the identity of the message dicts: drop_turns() keeps the same objects,
        # and the lists stay alive in the values, so an id is never reused while cached.
        self._ids: dict[tuple[int, ...],
                        tuple[list[Message], list[int], MultiModalPrompt | None]] = {}

    def __call__(self, messages: list[Message]) -> int:
        return len(self.ids(messages))

    def ids(self, messages: list[Message]) -> list[int]:
        """The prompt's token ids, each image's tokens included."""
        return self.prompt(messages)[0]

    def prompt(self, messages: list[Message]) -> tuple[list[int], MultiModalPrompt | None]:
        """The prompt's token ids and, with images among the messages, their
        MultiModalPrompt (a truncated list holds the images of the turns it kept)."""
        key = tuple(id(m) for m in messages)
        hit = self._ids.get(key)
        if hit is None:
            hit = self._ids[key] = (messages, *self._renderer.render_chat(messages, *self._args))
        return hit[1], hit[2]


@dataclass(frozen=True)
class LengthLimits:
    """The server's side of the length rules: the model's and the server's caps."""

    model: InputProcessor
    server_cap: int | None


@dataclass(frozen=True)
class LengthDecision:
    """What runs: `token_ids` (None for a notify or a refusal) and the decision, whose
    `reason` names the rule that fired (policy reasons, or MODEL_LENGTH / SERVER_CAP)."""

    decision: Decision
    token_ids: list[int] | None = None
    multimodal: MultiModalPrompt | None = None  # a chat's images, expanded in token_ids


def decide_length(policy: EffectivePolicy | None, messages: list[Message] | None,
                  measure: _MeasuredMessages | None, token_ids: list[int] | None,
                  limits: LengthLimits) -> LengthDecision:
    """Every length rule of a prompt, in one place (blocking: renders). A chat passes its
    `messages` and their `measure`; a completion its `token_ids`. Raises ValueError for a
    prompt the model cannot read at all (empty, ids outside the vocabulary)."""
    decision = Decision("allow")
    multimodal = None
    if messages is not None:
        assert measure is not None
        if policy is not None and (policy.max_context_tokens is not None
                                   or policy.max_turns is not None):
            decision = evaluate(policy, messages, measure)
            if decision.action in ("reject", "notify"):
                return LengthDecision(decision)
            if decision.action == "truncate":
                assert decision.messages is not None
                messages = decision.messages
        token_ids, multimodal = measure.prompt(messages)
    assert token_ids is not None
    try:
        limits.model.check_prompt(token_ids)
    except PromptTooLongError as exc:
        return LengthDecision(Decision("reject", message=str(exc), status=400,
                                       reason=MODEL_LENGTH))
    cap = limits.server_cap
    if cap is not None and len(token_ids) > cap:
        return LengthDecision(Decision("reject", message=context_limit_message(len(token_ids), cap),
                                       status=400, reason=SERVER_CAP))
    return LengthDecision(decision, token_ids, multimodal)


@dataclass(frozen=True)
class ChatPrompt:
    """A chat request's prompt as it will run (or the notice it gets instead)."""

    decision: Decision
    token_ids: list[int] | None
    thread_key: str | None
    turns: int
    # The images the prompt holds, expanded in token_ids (None: text only).
    multimodal: MultiModalPrompt | None = None

    @property
    def truncated_turns(self) -> int:
        return self.decision.turns_dropped if self.decision.action == "truncate" else 0


class Prompts:
    """Builds each request's prompt and answers its length refusals (counted, recorded)."""

    def __init__(self, renderer: PromptRenderer, limits: LengthLimits, refusals: Refusals) -> None:
        self.renderer = renderer
        self.limits = limits
        self.refusals = refusals

    async def chat(self, admission: Admission, messages: list[Message], thread: ChatThread,
                   add_generation_prompt: bool, template_kwargs: dict[str, Any],
                   images: ChatImages | None = None) -> ChatPrompt:
        """The prompt of a chat request (its `images` loaded: app/chat/image_parts.py);
        raises the APIError of a refusal. A front end's background task is held to
        background_task_policy: it is no turn of its chat."""
        measure = _MeasuredMessages(self.renderer, add_generation_prompt, template_kwargs,
                                    images)
        policy = (background_task_policy(admission.policy) if thread.task is not None
                  else admission.policy)
        outcome = await self._decide(admission, "messages", policy, messages, measure, None)
        d = outcome.decision
        if d.reason not in (None, MODEL_LENGTH, SERVER_CAP):  # the policy fired
            detail = {"thread_key": thread.key, "turns": d.turns, "tokens": d.prompt_tokens,
                      "limit": (admission.policy.max_context_tokens
                                if d.reason == "max_context_tokens" else admission.policy.max_turns)}
            if d.action == "truncate":
                detail.update(turns_dropped=d.turns_dropped, tokens_after=d.truncated_prompt_tokens)
            if thread.task is not None:
                detail["task"] = thread.task
            self.refusals.policy(admission.principal, d, admission.endpoint, detail)
            if d.action == "reject":
                raise decision_error(d)
        return ChatPrompt(d, outcome.token_ids, thread.key, count_turns(messages),
                          outcome.multimodal)

    async def completion(self, admission: Admission, prompt: str | list[int]) -> list[int]:
        """The token ids of one completion prompt; raises the APIError of a refusal."""
        ids = await run_in_threadpool(self.renderer.encode, prompt)
        outcome = await self._decide(admission, "prompt", None, None, None, ids)
        assert outcome.token_ids is not None
        return outcome.token_ids

    async def _decide(self, admission: Admission, param: str, policy: EffectivePolicy | None,
                      messages: list[Message] | None, measure: _MeasuredMessages | None,
                      ids: list[int] | None) -> LengthDecision:
        try:
            outcome = await run_in_threadpool(decide_length, policy, messages, measure, ids,
                                              self.limits)
        except ValueError as exc:
            self.refusals.server_limit(admission.principal, INVALID)
            raise APIError(400, str(exc), param=param) from exc
        d = outcome.decision
        if d.reason == MODEL_LENGTH:
            self.refusals.server_limit(admission.principal, MODEL_LENGTH)
            raise APIError(400, d.message or "", param=param, code="context_length_exceeded")
        if d.reason == SERVER_CAP:
            self.refusals.server_limit(admission.principal, SERVER_CAP)
            raise APIError(400, d.message or "", code="context_cap_exceeded")
        return outcome
