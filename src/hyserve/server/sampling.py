"""From request fields to ``SamplingParams``, with the model's generation_config.json as defaults.

vLLM (``--generation-config auto``, its default) takes temperature, top_p, top_k, min_p and
repetition_penalty from generation_config.json when a request leaves them out; Qwen checkpoints rely on
that for their recommended sampling, so a drop-in replacement must do the same.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hyserve.engine.sampling_params import SamplingParams
from hyserve.server.errors import APIError
from hyserve.server.protocol import SamplingFields

log = logging.getLogger(__name__)

DEFAULTABLE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# OpenAI's defaults where neither the request nor the model says otherwise
_FALLBACK = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


def load_sampling_defaults(model_dir: Path) -> dict[str, float]:
    """The sampling settings of ``model_dir/generation_config.json`` that requests may leave out."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return {}
    with open(path) as f:
        config = json.load(f)
    defaults = {k: config[k] for k in DEFAULTABLE if isinstance(config.get(k), int | float)}
    if defaults:
        log.info("default sampling settings from %s: %s", path, defaults)
    return defaults


def build_sampling_params(
    req: SamplingFields,
    defaults: dict[str, float],
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """Raises ``APIError(400)`` for values the engine cannot use (SamplingParams' own checks included)."""
    if req.logit_bias:
        raise APIError(400, "logit_bias is not supported", "logit_bias")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options can only be given with stream=true", "stream_options")

    def pick(name: str) -> float:
        value = getattr(req, name)
        if value is not None:
            return value
        return defaults.get(name, _FALLBACK[name])

    try:
        return SamplingParams(
            n=req.n,
            temperature=pick("temperature"),
            top_p=pick("top_p"),
            top_k=int(pick("top_k")),
            min_p=pick("min_p"),
            repetition_penalty=pick("repetition_penalty"),
            presence_penalty=pick("presence_penalty"),
            frequency_penalty=pick("frequency_penalty"),
            seed=req.seed,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=[req.stop] if isinstance(req.stop, str) else list(req.stop or []),
            stop_token_ids=list(req.stop_token_ids or []),
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=req.skip_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output,
        )
    except ValueError as e:
        # SamplingParams' messages start with the field they are about
        field = str(e).split(" ", 1)[0]
        raise APIError(400, str(e), field if field in SamplingParams.__dataclass_fields__ else None) from e
