"""The offline Python API: ``LLM(model_dir).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq
from typing import Any

from tqdm import tqdm

from hyserve.engine.llm_engine import EngineArgs, LLMEngine
from hyserve.engine.outputs import RequestOutput
from hyserve.engine.sampling_params import SamplingParams

PromptType = str | list[int]


class LLM:
    """Runs prompts to completion in batches; see ``EngineArgs`` for the keyword arguments."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.engine = LLMEngine(EngineArgs(model=model, **kwargs))
        self._ids = itertools.count()

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLM:
        llm = cls.__new__(cls)
        llm.engine = LLMEngine(args)
        llm._ids = itertools.count()
        return llm

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Seq[PromptType],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Prompts are texts or token-id lists; returns one finished ``RequestOutput`` per prompt, in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        per_prompt = list(params) if isinstance(params, Seq) else [params] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"{len(per_prompt)} sampling params given for {len(prompts)} prompts")
        order = []
        for prompt, p in zip(prompts, per_prompt):
            request_id = f"offline-{next(self._ids)}"
            self.engine.add_request(request_id, prompt, p)
            order.append(request_id)
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(order), desc="Generating", disable=not use_tqdm)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
                    bar.update(1)
        bar.close()
        return [done[r] for r in order]

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Apply the checkpoint's chat template (with the generation prompt) and generate."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer, so no chat template")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            self.tokenizer.apply_chat_template(
                conv, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
            )
            for conv in conversations
        ]
        return self.generate(prompts, sampling_params)
