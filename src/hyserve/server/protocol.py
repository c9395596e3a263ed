"""Request and response bodies of the OpenAI API (with vLLM's extra sampling fields).

Requests accept and ignore fields they do not know, as OpenAI and vLLM do, so newer clients keep working;
fields the engine cannot honour (``suffix``, a non-empty ``logit_bias``...) are rejected by the handlers
rather than silently dropped.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

MAX_N = 128  # choices per request: each is a sequence in the batch


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())


def _prompt_kind(v: object) -> str | None:
    """Which member of ``Prompt`` a prompt would be, from its first element, so pydantic validates that one
    alone: a smart union tries every member and builds one error per element for each that fails (~2 ms at
    4096 ids). None (not a string or a list) fails the union."""
    if isinstance(v, str):
        return "text"
    if not isinstance(v, list):
        return None
    if v and isinstance(v[0], str):
        return "texts"
    if v and isinstance(v[0], list):
        return "id_lists"
    return "ids"


# text, texts, token ids, or lists of token ids: each prompt is its own engine request
Prompt = Annotated[
    Union[  # noqa: UP007 - Tag annotations inside the union
        Annotated[StrictStr, Tag("text")],
        Annotated[list[StrictStr], Tag("texts")],
        Annotated[list[StrictInt], Tag("ids")],
        Annotated[list[list[StrictInt]], Tag("id_lists")],
    ],
    Discriminator(_prompt_kind),
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(_Request):
    """What the completion and chat endpoints share. ``None`` means "not given": the model's
    generation_config.json default applies, then OpenAI's."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: list[StrictInt] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    spaces_between_special_tokens: bool = (
        True  # accepted for vLLM clients; byte-level BPE has no spaces to add
    )


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: int | None = 16  # None: up to the model length
    logprobs: int | None = None  # top alternatives per token (the chosen token's logprob always comes)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompt_shape(cls, v: object, handler: ValidatorFunctionWrapHandler) -> object:
        """One clear message instead of pydantic's (one per element that is not of the member's type; strict
        types: a bool is not a token id). Only a bad prompt pays for it: checking every element's type
        before pydantic did cost ~60 us at 1024 ids."""
        try:
            return handler(v)
        except ValidationError:
            raise ValueError(
                "must be a string, a list of strings, a list of token ids or a list of lists of them"
            ) from None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, tool_calls... go to the template as given

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, v: object) -> object:
        if isinstance(v, list) and not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in v
        ):
            raise ValueError('content parts must be {"type": "text", "text": ...}; only text is supported')
        return v

    @model_validator(mode="after")
    def _content_needed(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.model_extra.get("tool_calls")):
            raise ValueError(f"a {self.role} message needs content")
        return self

    def for_template(self) -> dict[str, Any]:
        """The dict chat templates expect: text parts joined by newlines (as vLLM does)."""
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        return {**(self.model_extra or {}), "role": self.role, "content": content}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # wins over max_tokens; None for both: up to the model length
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None  # shown to the template; tool calls are not parsed
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false}
    add_generation_prompt: bool = True
    continue_final_message: bool = False


# ---- responses ----


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """The legacy completions format: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)  # None for the first prompt token
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)  # characters from the start of the choice's text

    def extend(self, more: CompletionLogprobs) -> CompletionLogprobs:
        self.tokens += more.tokens
        self.token_logprobs += more.token_logprobs
        self.top_logprobs += more.top_logprobs
        self.text_offset += more.text_offset
        return self


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM: the stop token id or string; None for EOS or length


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "hyserve"
    root: str  # the model folder
    parent: str | None = None
    max_model_len: int  # tokens (prompt + output)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
