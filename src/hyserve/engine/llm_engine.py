"""The engine loop: requests in, one scheduler step + one model step at a time, outputs out."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from hyserve.config import ModelConfig
from hyserve.engine.cache_manager import CacheConfig, CacheManager
from hyserve.engine.detokenizer import IncrementalDetokenizer
from hyserve.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from hyserve.engine.runner import ModelRunner, PendingStep, RunnerOutput, cache_bytes
from hyserve.engine.sampling_params import SamplingParams
from hyserve.engine.scheduler import ScheduledSequence, Scheduler, SchedulerConfig, SchedulerOutput
from hyserve.engine.sequence import Sequence, SequenceStatus
from hyserve.layers.routed_projection import prepare_routed_projections
from hyserve.model.loader import build_model

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
_CPU_CACHE_CAP = 2 << 30


@dataclass
class EngineArgs:
    model: str  # a Hugging Face model folder (config.json, weights unless dummy, tokenizer files)
    tokenizer: str | None = None  # defaults to the model folder
    device: str | None = None  # "cuda" or "cpu"; default cuda when present
    dtype: str = "auto"  # bfloat16 | float32 | float16 | auto (bfloat16 on cuda, float32 on cpu)
    load_format: str = "auto"  # auto | safetensors | dummy
    seed: int = 0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None  # default: min(max_position_embeddings, 32768)
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_gb: float | None = None  # fixed KV cache size instead of measuring free memory
    enforce_eager: bool = False  # never capture CUDA graphs
    async_scheduling: bool = True  # launch the next decode step before reading the previous one's tokens
    cuda_graph_sizes: list[int] | None = None  # decode batch sizes to capture (default: up to max_num_seqs)
    # prompt lengths (tokens) of whole-prefill graphs; None: 128, 256, ..., 4096 that fit; []: none
    prefill_graph_sizes: list[int] | None = None
    warmup: bool = True  # on CUDA, compile the prefill kernels at start-up (engine/warmup.py)
    # on CUDA with graphs, decode steps of <= 4 greedy requests take the greedy token through an int8 screen
    # of the LM head instead of all its logits (+0.5 GB at 248320 x 2048; kernels/greedy_head)
    greedy_screen: bool = True
    # on CUDA with graphs, a one-token step routes each MoE layer inside its mixer's projections instead of a
    # router launch (+3 MB a layer of router rows; layers/routed_projection.py)
    routed_projections: bool = True
    # on CUDA with graphs and the routed projections, a one-token step's in-projections stream lossless 12-bit
    # copies through the tensor-core GEMV (+1.5 GB for Qwen3.6-35B-A3B; layers/mma_projections.py)
    mma_projections: bool = True
    # on CUDA, the expert kernels of prefills up to ~1024 tokens, of batched decode and of one-token steps stream
    # 12-bit tensor-core copies of the experts' gate_up and down (+48.8 GB for Qwen3.6-35B-A3B;
    # layers/mma_projections.py): on the H200 single-stream decode 511 -> 584 tok/s (docs/performance.md). With the
    # bf16 experts kept beside the copies (mma_experts_only False) the model takes ~119 GB: gpu_memory_utilization
    # 0.95 on the H200.
    mma_experts: bool = False
    # with mma_experts: release the experts' bf16 weights once their copies exist, so the model takes ~54 GB instead of
    # ~119 GB (Qwen3.6-35B-A3B); every expert path then streams the copies (prompts of ~2048 tokens and more through
    # the grouped 12-bit kernels at BLOCK_M 64, where the bf16 ones ran at 128); CUDA only, no reference path.
    # None: on for a bf16 MoE checkpoint on CUDA unless mma_experts asked to keep the bf16 experts (``experts_only``)
    mma_experts_only: bool | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        self.mma_experts = self.mma_experts or bool(self.mma_experts_only)  # the copies are what is left

    def resolved_device(self) -> torch.device:
        name = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if name not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', got {name!r}")
        if name == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for, but no CUDA device is visible")
        return torch.device(name)

    def resolved_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {self.dtype!r}")
        return DTYPES[self.dtype]


def load_eos_token_ids(model_dir: Path, config: ModelConfig, tokenizer: Any) -> tuple[int, ...]:
    """EOS ids: generation_config.json's eos_token_id (int or list), else config's, else the tokenizer's."""
    ids: list[int] = []
    path = model_dir / "generation_config.json"
    if path.is_file():
        with open(path) as f:
            eos = json.load(f).get("eos_token_id")
        ids = list(eos) if isinstance(eos, list) else ([] if eos is None else [eos])
    if not ids:
        ids = list(config.eos_token_ids)
    if not ids and tokenizer is not None and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    return tuple(int(i) for i in ids)


def load_tokenizer(path: Path) -> Any:
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        log.warning("no tokenizer files in %s: the engine accepts and returns token ids only", path)
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    detoks: list[IncrementalDetokenizer]
    metrics: RequestMetrics
    prompt_logprobs: list | None = None


def experts_only(args: EngineArgs, device: torch.device, dtype: torch.dtype, config: ModelConfig) -> bool:
    """Whether the experts run from their 12-bit copies alone: as asked, else for a bf16 MoE checkpoint on CUDA (the
    copies' kernels) unless ``mma_experts`` asked for the copies beside the bf16 experts."""
    if args.mma_experts_only is not None:
        return args.mma_experts_only
    return device.type == "cuda" and dtype == torch.bfloat16 and config.is_moe and not args.mma_experts


class LLMEngine:
    def __init__(self, args: EngineArgs) -> None:
        self.device = args.resolved_device()
        self.dtype = args.resolved_dtype(self.device)
        if args.mma_experts_only and self.device.type != "cuda":
            raise ValueError(
                "--mma-experts-only keeps only the experts' 12-bit copies, which run on CUDA only; "
                f"device is {self.device}"
            )
        model_dir = Path(args.model)
        self.config = ModelConfig.from_pretrained(model_dir)
        # resolved here (the default depends on the device and the checkpoint); __post_init__ implies mma_experts
        self.args = args = replace(
            args, mma_experts_only=experts_only(args, self.device, self.dtype, self.config)
        )
        self.tokenizer = load_tokenizer(Path(args.tokenizer or model_dir))
        self.eos_token_ids = load_eos_token_ids(model_dir, self.config, self.tokenizer)
        start = time.perf_counter()
        torch.manual_seed(args.seed)
        if args.mma_experts_only:
            from hyserve.layers.mma_projections import expandable_memory

            expandable_memory()
        self.model = build_model(
            self.config,
            model_dir,
            self.device,
            self.dtype,
            args.load_format,
            args.seed,
            progress=args.progress,
        )
        log.info("model ready in %.1f s on %s (%s)", time.perf_counter() - start, self.device, self.dtype)
        if self.device.type == "cuda" and args.greedy_screen and not args.enforce_eager:
            nbytes = self.model.lm_head.prepare_greedy_screen()
            log.info("greedy screen of the LM head: %.2f GB", nbytes / 1e9)
        if self.device.type == "cuda" and args.routed_projections and not args.enforce_eager:
            nbytes = prepare_routed_projections(self.model)
            log.info("router rows in the mixers' projections: %.2f GB", nbytes / 1e9)
            from hyserve.layers import mma_projections

            if args.mma_projections:
                nbytes = mma_projections.prepare_mma_projections(self.model)
                log.info("12-bit tensor-core copies of the routed in-projections: %.2f GB", nbytes / 1e9)
        if self.device.type == "cuda" and args.mma_experts:  # the grouped kernels, eager or in graphs
            from hyserve.layers.mma_projections import prepare_mma_experts

            nbytes = prepare_mma_experts(self.model, release=args.mma_experts_only)
            log.info(
                "12-bit tensor-core copies of the experts' gate_up and down: %.2f GB%s",
                nbytes / 1e9,
                " (their bf16 weights released)" if args.mma_experts_only else "",
            )
        self.max_model_len = args.max_model_len or min(self.config.max_position_embeddings, 32768)
        if self.max_model_len > self.config.max_position_embeddings:
            raise ValueError(
                f"--max-model-len {self.max_model_len} exceeds the model's max_position_embeddings "
                f"{self.config.max_position_embeddings} (config.json); allowed: 1..{self.config.max_position_embeddings}"
            )
        cache_config = self._plan_cache()
        self.scheduler_config = SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=self.max_model_len,
        )
        limit = min(args.max_num_batched_tokens, self.max_model_len - 1)
        for size in args.prefill_graph_sizes or []:
            if not 1 <= size <= limit:
                raise ValueError(
                    f"prefill graph size {size} is outside 1..{limit} (a prompt prefilled in one step, with "
                    "room for a generated token, is bounded by max_num_batched_tokens and max_model_len - 1)"
                )
        self.cache_manager = CacheManager(cache_config)
        self.scheduler = Scheduler(self.scheduler_config, self.cache_manager)
        self.runner = ModelRunner(
            self.model, self.config, cache_config, self.device, self.dtype, self.eos_token_ids
        )
        self.requests: dict[str, _Request] = {}
        self._pending: PendingStep | None = None  # a launched step whose tokens the host has not read
        self.last_step: SchedulerOutput | None = None  # the step whose results the last step() returned
        if self.device.type == "cuda" and not args.enforce_eager:
            from hyserve.engine.cuda_graphs import capture_sizes

            sizes = args.cuda_graph_sizes or capture_sizes(args.max_num_seqs)
            start = time.perf_counter()
            self.runner.capture_graphs(sizes, self.max_model_len, progress=args.progress)
            from hyserve.engine.prefill_graphs import default_prefill_sizes

            prefill_sizes = args.prefill_graph_sizes
            if prefill_sizes is None:
                prefill_sizes = default_prefill_sizes(limit)
            if prefill_sizes:
                self.runner.capture_prefill_graphs(prefill_sizes, self.max_model_len, progress=args.progress)
            log.info("graph capture took %.1f s", time.perf_counter() - start)
        if self.device.type == "cuda" and args.warmup:
            from hyserve.engine.warmup import warm_up

            warm_up(self)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def _plan_cache(self) -> CacheConfig:
        args = self.args
        block_size = args.block_size
        block_bytes, slot_bytes = cache_bytes(self.config, block_size, self.dtype)
        slots = args.max_num_seqs
        if args.kv_cache_memory_gb is not None:
            budget = int(args.kv_cache_memory_gb * (1 << 30))
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            reserve = int(total * (1 - args.gpu_memory_utilization))
            activations = self._activation_bytes()
            budget = free - reserve - activations - (slots + 1) * slot_bytes
        else:
            wanted = args.max_num_seqs * self.max_model_len // block_size * block_bytes
            budget = min(wanted, _CPU_CACHE_CAP)
        num_blocks = max(1, budget // max(1, block_bytes)) if block_bytes else 1
        need = -(-self.max_model_len // block_size)
        if block_bytes and num_blocks < need:
            raise ValueError(
                f"the KV cache holds {num_blocks * block_size} tokens, fewer than max_model_len "
                f"{self.max_model_len}; lower --max-model-len or raise --gpu-memory-utilization"
            )
        config = CacheConfig(block_size=block_size, num_blocks=int(num_blocks), num_state_slots=slots)
        log.info(
            "cache: %d KV blocks x %d tokens (%.2f GiB, %d tokens), %d DeltaNet state slots (%.2f GiB)",
            config.num_blocks,
            block_size,
            config.num_blocks * block_bytes / (1 << 30),
            config.num_blocks * block_size,
            slots,
            (slots + 1) * slot_bytes / (1 << 30),
        )
        return config

    def _activation_bytes(self) -> int:
        """Peak activation memory of the largest step, estimated from the shapes (with a 2x margin)."""
        c = self.config
        t = self.args.max_num_batched_tokens
        item = torch.empty((), dtype=self.dtype).element_size()
        widest = max(c.linear_conv_dim + c.linear_value_dim, 2 * c.num_attention_heads * c.head_dim)
        ffn = 2 * max(c.moe_intermediate_size * c.num_experts_per_tok, c.intermediate_size)
        per_token = (4 * c.hidden_size + 2 * widest + ffn) * item + 4 * c.vocab_size // 16
        return 2 * t * per_token + (512 << 20)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        *,
        checked: bool = False,
    ) -> None:
        """Queue a request. ``prompt`` is text (encoded as is, no special tokens added) or token ids.

        ``checked``: the ids have passed ``validate_prompt`` with these params already (the server's admission
        checks them to answer 400 before queueing); its passes over the prompt, ~40 us at 1024 ids, would
        otherwise be made again in the engine thread, before the step the request waits for."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer; send token ids")
            text, token_ids = prompt, self.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            text, token_ids = None, list(prompt)
        if text is not None or not checked:
            self.validate_prompt(token_ids, params)
        now = time.monotonic() if arrival_time is None else arrival_time
        seqs = [
            Sequence(request_id, list(token_ids), params, index=i, arrival_time=now) for i in range(params.n)
        ]
        detoks = [
            IncrementalDetokenizer(
                self.tokenizer, params.stop, params.skip_special_tokens, params.include_stop_str_in_output
            )
            for _ in seqs
        ]
        req = _Request(request_id, text, list(token_ids), params, seqs, detoks, RequestMetrics(now))
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]
        for seq in seqs:
            self.scheduler.add(seq)
        self.requests[request_id] = req

    def validate_prompt(self, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise ValueError("the prompt is empty")
        vocab = self.config.vocab_size
        if min(token_ids) < 0 or max(token_ids) >= vocab:  # builtins: ~10x a Python loop at 4096 ids
            bad = next(t for t in token_ids if not 0 <= t < vocab)
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{vocab - 1})")
        limit = self.max_model_len
        if len(token_ids) >= limit:
            raise ValueError(f"the prompt has {len(token_ids)} tokens; this model's length is {limit}")
        if params.max_tokens is not None and len(token_ids) + params.max_tokens > limit:
            raise ValueError(
                f"the prompt ({len(token_ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds the "
                f"model length {limit}"
            )

    def abort_request(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        for seq in req.seqs:
            if not seq.status.finished:
                self.scheduler.abort(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or self._pending is not None

    @property
    def num_running(self) -> int:
        return len({s.request_id for s in self.scheduler.running})

    @property
    def num_waiting(self) -> int:
        return len(
            {s.request_id for s in self.scheduler.waiting} - {s.request_id for s in self.scheduler.running}
        )

    def step(self) -> list[RequestOutput]:
        """Run one scheduler + model step. Returns an output for each request that progressed.

        With async scheduling, a decode step is launched before the previous step's tokens reach the host
        (its input tokens come straight from the device), so the GPU runs while the host detokenises and
        checks stops; a sequence that turns out to have stopped wastes one token of compute.
        """
        self.last_step = None
        if self._pending is None:
            out = self.scheduler.schedule()
            if out.empty:
                return []
            self._pending = self.runner.launch(out)
            self.scheduler.update_computed(out)
        pending, self._pending = self._pending, None
        self._pending = self._launch_ahead(pending)
        self.last_step = pending.out
        return self._process(pending.out, pending.wait())

    def _launch_ahead(self, pending: PendingStep) -> PendingStep | None:
        """Launch the next decode step for the sequences that will surely continue, or return None.

        With requests waiting, only while none of them could join the next step anyway (every sequence
        slot taken, none freed by a length limit in ``pending``): a full batch with a queue behind it (the
        c=32 benchmark's steady state) then keeps the GPU fed too. A sequence that stops on a stop token
        frees its slot one step late (its waiting successor starts one decode step later)."""
        if not self.args.async_scheduling or pending.sampled is None:
            return None
        if not pending.out.is_decode or len(pending.seqs) != len(pending.out.scheduled):
            return None
        waiting = bool(self.scheduler.waiting)
        if waiting and len(self.scheduler.running) < self.scheduler.config.max_num_seqs:
            return None  # a waiting request may be admitted: schedule the next step on the host
        rows, entries = [], []
        for i, seq in enumerate(pending.seqs):
            p = seq.params
            if p.needs_penalties or seq.status.finished:
                return None  # penalties need the token the host has not seen yet
            if self._length_reached(seq, in_flight=1):
                if waiting:
                    return None  # its slot goes to a waiting request in the next step
                continue
            if not self.cache_manager.can_allocate(seq, seq.num_computed_tokens + 1):
                return None
            rows.append(i)
            entries.append(ScheduledSequence(seq, 1, sample=True))
        if not entries:
            return None
        for e in entries:
            self.cache_manager.allocate(e.seq, e.seq.num_computed_tokens + 1)
        tokens = pending.sampled.tokens
        if len(rows) != len(pending.seqs):
            tokens = tokens[torch.tensor(rows, device=tokens.device)]
        nxt = SchedulerOutput(entries)
        launched = self.runner.launch(nxt, input_tokens=tokens, offset=1)
        self.scheduler.update_computed(nxt)
        return launched

    def _process(self, out: SchedulerOutput, result: RunnerOutput) -> list[RequestOutput]:
        now = time.monotonic()
        touched: dict[str, _Request] = {}
        for entry in out.scheduled:
            seq = entry.seq
            req = self.requests.get(seq.request_id)
            if req is None or seq.status.finished:
                continue  # aborted, or stopped while this step was in flight
            if seq.seq_id in result.prompt_logprobs and seq.index == 0 and req.prompt_logprobs is not None:
                req.prompt_logprobs.extend(result.prompt_logprobs[seq.seq_id])
            if seq.seq_id not in result.sampled:
                continue
            if req.metrics.first_token_time is None:
                req.metrics.first_token_time = now
            touched[req.request_id] = req
            if seq.params.max_tokens == 0:  # prompt logprobs only (echo)
                self.scheduler.finish(seq, SequenceStatus.FINISHED_LENGTH)
                continue
            seq.output_token_ids.append(result.sampled[seq.seq_id])
            if seq.seq_id in result.logprobs:
                seq.output_logprobs.append(result.logprobs[seq.seq_id])
            self._check_stop(seq, req.detoks[seq.index])
        outputs = []
        for req in touched.values():
            finished = all(s.status.finished for s in req.seqs)
            if finished:
                req.metrics.finished_time = now
                del self.requests[req.request_id]
            outputs.append(self._output(req, finished))
        return outputs

    def _length_reached(self, seq: Sequence, in_flight: int = 0) -> bool:
        """``seq`` has reached max_tokens or the model length, counting ``in_flight`` tokens not yet appended."""
        max_tokens = seq.params.max_tokens
        n_out = len(seq.output_token_ids) + in_flight
        return (
            max_tokens is not None and n_out >= max_tokens
        ) or seq.num_tokens + in_flight >= self.max_model_len

    def _check_stop(self, seq: Sequence, detok: IncrementalDetokenizer) -> None:
        p = seq.params
        token = seq.output_token_ids[-1]
        n_out = len(seq.output_token_ids)
        status = None
        if n_out >= p.min_tokens:
            if not p.ignore_eos and token in self.eos_token_ids:
                status, seq.stop_reason = SequenceStatus.FINISHED_STOPPED, None
            elif token in p.stop_token_ids:
                status, seq.stop_reason = SequenceStatus.FINISHED_STOPPED, token
        shown = seq.output_token_ids[:-1] if status is not None else seq.output_token_ids
        stop_str = detok.update(shown)
        if status is None and stop_str is not None and n_out >= p.min_tokens:
            status, seq.stop_reason = SequenceStatus.FINISHED_STOPPED, stop_str
        if status is None and self._length_reached(seq):
            status = SequenceStatus.FINISHED_LENGTH
        if status is not None:
            detok.flush(shown)
            self.scheduler.finish(seq, status)

    def _output(self, req: _Request, finished: bool) -> RequestOutput:
        choices = []
        for seq, detok in zip(req.seqs, req.detoks):
            done = seq.status.finished
            choices.append(
                CompletionOutput(
                    index=seq.index,
                    text=detok.visible_text(done),
                    token_ids=list(seq.output_token_ids),
                    finish_reason=seq.status.value if done else None,
                    stop_reason=seq.stop_reason,
                    logprobs=list(seq.output_logprobs) if req.params.logprobs is not None else None,
                )
            )
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,
            outputs=choices,
            finished=finished,
            metrics=req.metrics,
            prompt_logprobs=req.prompt_logprobs,
            num_preemptions=sum(s.num_preemptions for s in req.seqs),
        )
