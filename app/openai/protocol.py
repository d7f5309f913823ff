"""Request bodies of the OpenAI routes and of vLLM's /tokenize and /detokenize (pydantic), and
the generation routes' translation to SamplingParams.

Unknown fields are ignored: clients send many. Every field that changes the output is
honoured or refused with a 400 that says so: response_format, structured_outputs and the
guided_* fields constrain it (app/chat/output_constraint.py), tools and tool_choice call
functions (app/chat/tools.py); the legacy functions/function_call are refused.

Checked once each: pydantic checks types (finite numbers included) and the rules that are
OpenAI's own (temperature <= 2, at least one message); the ranges of the sampling fields are
SamplingParams' (engine/sampling_params.BOUNDS), enforced when sampling_params() builds it and
only shown here, in the JSON schema, so clients and fuzzers see them. Pydantic's errors become
400s in app/error_handlers.py; a SamplingParamsError becomes one in the route, its field as
`param`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from officellm.app.chat.image_parts import image_part, part_content, text_part
from officellm.app.chat.output_constraint import (
    Constraint,
    ResponseFormat,
    StructuredOutputsRequest,
    request_constraint,
)
from officellm.app.chat.reasoning_effort import effort_kwargs
from officellm.app.chat.tools import ChatTool, ToolChoice, ToolRequest, template_message
from officellm.engine import BOUNDS, SamplingParams, SamplingParamsError, StructuredOutputsParams

# Roles a chat template can render here ("tool": a function's result, after a tool call).
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def bounded(name: str) -> Callable[[dict[str, Any]], None]:
    """json_schema_extra showing SamplingParams' bound of `name` (Bound.json_schema) on the
    numeric branch of the field's schema. Documentation only: SamplingParams enforces it."""
    extra = BOUNDS[name].json_schema()

    def add(schema: dict[str, Any]) -> None:
        for branch in schema.get("anyOf", [schema]):
            if branch.get("type") in ("integer", "number"):
                branch.update(extra)
    return add


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _SamplingFields(BaseModel):
    """Fields shared by chat and completions, OpenAI's and vLLM's extras."""

    # NaN and Infinity parse as JSON numbers in Python; no sampling field means anything by them.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str | None = None
    n: int = Field(1, json_schema_extra=bounded("n"))
    max_tokens: int | None = Field(None, json_schema_extra=bounded("max_tokens"))
    # OpenAI's own ceiling (SamplingParams only needs temperature >= 0).
    temperature: float | None = Field(None, le=2.0, json_schema_extra=bounded("temperature"))
    top_p: float | None = Field(None, json_schema_extra=bounded("top_p"))
    stop: str | list[str] | None = None
    seed: int | None = Field(None, json_schema_extra=bounded("seed"))
    presence_penalty: float = Field(0.0, json_schema_extra=bounded("presence_penalty"))
    frequency_penalty: float = Field(0.0, json_schema_extra=bounded("frequency_penalty"))
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's extras
    top_k: int | None = Field(None, json_schema_extra=bounded("top_k"))  # <= 0: disabled
    min_p: float | None = Field(None, json_schema_extra=bounded("min_p"))
    repetition_penalty: float | None = Field(None, json_schema_extra=bounded("repetition_penalty"))
    min_tokens: int = Field(0, json_schema_extra=bounded("min_tokens"))
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Output constraints: OpenAI's, vLLM's, and vLLM's older names.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str]:
        if v is None:
            return []
        return [v] if isinstance(v, str) else v

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def output_constraint(self) -> Constraint | None:
        """The constraint response_format / structured_outputs / guided_* name, if any;
        StructuredOutputError (-> 400) for two at once."""
        return request_constraint(self.response_format, self.structured_outputs,
                                  {"guided_json": self.guided_json,
                                   "guided_regex": self.guided_regex,
                                   "guided_choice": self.guided_choice,
                                   "guided_grammar": self.guided_grammar})

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None,
                         constraint: StructuredOutputsParams | None,
                         names: dict[str, str] | None = None,
                         prompt_logprobs: int | None = None) -> SamplingParams:
        """SamplingParams from the request; a SamplingParamsError (-> 400) for a value it
        refuses, naming the request's field (`names`: SamplingParams' field -> the request's,
        where they differ)."""
        try:
            return self._build(max_tokens, logprobs, constraint, prompt_logprobs)
        except SamplingParamsError as exc:
            raise exc.renamed((names or {}).get(exc.field, exc.field)) from None

    def _build(self, max_tokens: int | None, logprobs: int | None,
               constraint: StructuredOutputsParams | None,
               prompt_logprobs: int | None) -> SamplingParams:
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=list(self.stop or []),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            structured_outputs=constraint,
        )


class ChatMessage(BaseModel):
    """One message; extra keys (name, tool_calls, tool_call_id, ...) are kept for the chat
    template."""

    model_config = ConfigDict(extra="allow")

    # The schema lists the roles (clients and fuzzers see what is valid); the check itself is
    # check_roles, run by each request model, for a message that names the unknown role.
    role: str = Field(json_schema_extra={"enum": sorted(CHAT_ROLES)})
    content: str | list[dict[str, Any]] | None = None

    def to_template_dict(self) -> dict[str, Any]:
        """A plain dict for the chat template: text parts joined into one string, or, with
        an image_url part among them, the parts as the template takes them
        (app/chat/image_parts.py). An image_url's `detail` is accepted and changes nothing:
        the model's own processor decides the resolution."""
        d = self.model_dump(exclude_none=True)
        content = self.content
        if isinstance(content, list):
            d["content"] = part_content([_content_part(part) for part in content], "\n")
        elif content is None:
            d["content"] = ""
        return template_message(d)


def _content_part(part: dict[str, Any]) -> dict[str, Any]:
    """A chat message's content part as a template part; ValueError (a 400) for another."""
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str):
        return text_part(part["text"])
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise ValueError("An image_url part is {\"type\": \"image_url\", \"image_url\": "
                             "{\"url\": a data URI or an http(s) URL}}.")
        return image_part(url)
    raise ValueError(f"Content part type {kind!r} is not supported: send text and image_url "
                     "parts.")


def check_roles(messages: list[ChatMessage]) -> None:
    """ValueError for a message whose role no chat template here renders."""
    for message in messages:
        if message.role not in CHAT_ROLES:
            raise ValueError(f"Unsupported message role {message.role!r}; use one of "
                             f"{', '.join(sorted(CHAT_ROLES))}.")


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, json_schema_extra=bounded("max_tokens"))
    logprobs: bool = False
    top_logprobs: int | None = Field(None, json_schema_extra=bounded("logprobs"))
    # OpenAI's reasoning models' effort: the template's reasoning_effort (gpt-oss's).
    reasoning_effort: str | None = None
    # vLLM's extras
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    # OpenAI's deprecated function calling: accepted here only to refuse it plainly.
    functions: list[Any] | None = None
    function_call: Any = None

    @model_validator(mode="after")
    def _check_messages(self) -> ChatCompletionRequest:
        if self.functions or self.function_call not in (None, "none"):
            raise ValueError("The deprecated functions/function_call fields are not supported; "
                             "send the functions as tools (tool_choice for function_call).")
        check_roles(self.messages)
        return self

    def tool_request(self) -> ToolRequest | None:
        """What the tools and tool_choice ask for (None: no tools in play); ValueError
        (-> 400) for a choice naming no given tool."""
        return ToolRequest.of(self.tools, self.tool_choice, self.parallel_tool_calls)

    def template_kwargs(self) -> dict[str, Any]:
        """The chat template's extra arguments: reasoning_effort's, then chat_template_kwargs
        (which name them outright, so they win)."""
        return {**effort_kwargs(self.reasoning_effort), **(self.chat_template_kwargs or {})}

    def sampling_params(self, constraint: StructuredOutputsParams | None = None) -> SamplingParams:
        """SamplingParams for the request, with the output constraint the route chose
        (the request's own, or a forced tool call's)."""
        names = {}
        max_tokens = self.max_tokens
        if self.max_completion_tokens is not None:  # OpenAI's newer name wins
            max_tokens, names["max_tokens"] = self.max_completion_tokens, "max_completion_tokens"
        if self.top_logprobs and not self.logprobs:
            raise SamplingParamsError("top_logprobs", "top_logprobs requires logprobs to be true.")
        logprobs = None
        if self.logprobs:
            logprobs, names["logprobs"] = self.top_logprobs or 0, "top_logprobs"
        return self._sampling_params(max_tokens, logprobs, constraint, names)


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. `prompt` is a string, token ids, or a batch of either.

    OpenAI's legacy scoring: with `echo` and `logprobs` the prompt's tokens come back first,
    with their logprobs (null for the first token), then the generated ones; `max_tokens: 0`
    with `echo` scores the prompt alone.
    """

    prompt: str | list[str] | list[int] | list[list[int]]
    # OpenAI's default for completions. The schema shows SamplingParams' bound (at least 1):
    # 0 is the one exception, with echo, and is told in the description.
    max_tokens: int | None = Field(
        16, json_schema_extra=bounded("max_tokens"),
        description="Tokens to generate; 0 is allowed with echo: the prompt is scored alone.")
    logprobs: int | None = Field(None, json_schema_extra=bounded("logprobs"))
    echo: bool = Field(False, description="Return the prompt before the completion; with "
                                          "logprobs, the prompt tokens' logprobs too.")

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts (one element for a single prompt)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("The prompt is empty.")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    @property
    def scores_prompt_only(self) -> bool:
        """echo with max_tokens 0: the answer is the prompt and its logprobs, nothing
        generated."""
        return self.echo and self.max_tokens == 0

    def sampling_params(self, constraint: StructuredOutputsParams | None = None) -> SamplingParams:
        """SamplingParams for the request: prompt logprobs when echo asks for logprobs, and
        one token generated for max_tokens 0 (the engine always samples one; the route
        leaves it out of the answer)."""
        max_tokens = self.max_tokens
        if max_tokens == 0:
            if not self.echo:
                raise SamplingParamsError(
                    "max_tokens", "max_tokens must be at least 1, got 0 (0 is allowed only "
                    "with echo: true, to score the prompt without generating).",
                    BOUNDS["max_tokens"], 0)
            if self.min_tokens:
                raise SamplingParamsError(
                    "min_tokens", f"min_tokens ({self.min_tokens}) must not exceed max_tokens "
                    "(0).", value=self.min_tokens)
            max_tokens = 1
        prompt_logprobs = self.logprobs if self.echo else None
        return self._sampling_params(max_tokens, self.logprobs, constraint,
                                     prompt_logprobs=prompt_logprobs)


# -- vLLM's /tokenize and /detokenize --------------------------------------------------------

class TokenizeCompletionRequest(BaseModel):
    """POST /tokenize with a text `prompt`: its ids as /v1/completions reads it."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str
    add_special_tokens: bool = Field(
        True, description="Add the tokenizer's special tokens (e.g. BOS), as /v1/completions does.")
    return_token_strs: bool = Field(False, description="Also return each token's string.")


class TokenizeChatRequest(BaseModel):
    """POST /tokenize with chat `messages`: their ids as /v1/chat/completions renders them."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = Field(
        False, description="Add the tokenizer's special tokens on top of the chat template's "
                           "(which adds the model's own: leave it false, as chat completions do).")
    return_token_strs: bool = Field(False, description="Also return each token's string.")
    # How a template renders tools depends on the request's tool_choice (app/openai/
    # chat_formats.py): a count without that would not be the chat route's count.
    tools: list[Any] | None = None

    @model_validator(mode="after")
    def _renderable(self) -> TokenizeChatRequest:
        if self.tools:
            raise ValueError("/tokenize does not count tools; send the messages alone.")
        check_roles(self.messages)
        return self


def _tokenize_form(body: Any) -> str | None:
    """The form of a /tokenize body, by the field only it has; None (a 400) for neither or
    both, which vLLM would resolve by guessing."""
    if isinstance(body, BaseModel):
        return type(body).__name__
    if not isinstance(body, dict) or ("prompt" in body) == ("messages" in body):
        return None
    return "TokenizeChatRequest" if "messages" in body else "TokenizeCompletionRequest"


# vLLM's TokenizeRequest: one of the two forms.
TokenizeRequest = Annotated[
    Annotated[TokenizeCompletionRequest, Tag("TokenizeCompletionRequest")]
    | Annotated[TokenizeChatRequest, Tag("TokenizeChatRequest")],
    Discriminator(_tokenize_form, custom_error_type="prompt_or_messages",
                  custom_error_message="Send `prompt` (a text) or `messages` (a chat): one of "
                                       "the two."),
]
# Pydantic puts the form's tag in the path of an error inside it: no field of the request,
# so app/error_handlers.py leaves it out of `param`.
UNION_TAGS = frozenset({"TokenizeCompletionRequest", "TokenizeChatRequest"})


class DetokenizeRequest(BaseModel):
    """POST /detokenize: token ids back to text."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int]
