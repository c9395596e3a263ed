"""The ``hyserve`` command: generate, serve, verify, bench."""

from __future__ import annotations

import argparse
import logging
import sys

from hyserve.engine.args import add_engine_arguments, engine_args_from


def _generate(ns: argparse.Namespace) -> int:
    from hyserve.engine.sampling_params import SamplingParams
    from hyserve.llm import LLM

    llm = LLM.from_engine_args(engine_args_from(ns))
    params = SamplingParams(
        temperature=ns.temperature,
        top_p=ns.top_p,
        top_k=ns.top_k,
        max_tokens=ns.max_tokens,
        seed=ns.sampling_seed,
        ignore_eos=ns.ignore_eos,
    )

    def run(prompts: list[str]) -> None:
        if ns.chat:
            outs = [llm.chat([{"role": "user", "content": p}], params)[0] for p in prompts]
        else:
            outs = llm.generate(prompts, params)
        for prompt, out in zip(prompts, outs):
            print(f"{prompt!r} -> {out.outputs[0].text!r}", flush=True)

    if ns.prompt:
        run(ns.prompt)
        return 0
    print("hyserve interactive generation; an empty line or Ctrl-D quits.", flush=True)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        run([line])
    return 0


def _verify(ns: argparse.Namespace) -> int:
    from hyserve.verify import run_verify

    return run_verify(ns)


def _serve(ns: argparse.Namespace) -> int:
    from hyserve.server import run_server

    return run_server(ns)


def _bench(ns: argparse.Namespace) -> int:
    from hyserve.bench import run_bench

    return run_bench(ns)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyserve", description=__doc__)
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate from prompts (or interactively) with the offline engine")
    add_engine_arguments(gen)
    gen.add_argument("--prompt", action="append", help="a prompt; repeat for a batch; none: interactive")
    gen.add_argument(
        "--chat", action=argparse.BooleanOptionalAction, default=True, help="apply the chat template"
    )
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.set_defaults(func=_generate)

    ver = sub.add_parser("verify", help="compare the engine with transformers on the same weights")
    add_engine_arguments(ver)
    from hyserve.verify import add_verify_arguments

    add_verify_arguments(ver)
    ver.set_defaults(func=_verify)

    srv = sub.add_parser("serve", help="the OpenAI-compatible HTTP server")
    add_engine_arguments(srv)
    try:
        from hyserve.server import add_serve_arguments
    except ImportError:  # the server's dependencies are missing
        add_serve_arguments = None
    if add_serve_arguments is not None:
        add_serve_arguments(srv)
    srv.set_defaults(func=_serve)

    bench = sub.add_parser("bench", help="load-test an OpenAI-compatible server")
    try:
        from hyserve.bench import add_bench_arguments
    except ImportError:
        add_bench_arguments = None
    if add_bench_arguments is not None:
        add_bench_arguments(bench)
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    logging.basicConfig(level=ns.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(ns.func(ns) or 0)
    except ValueError as e:
        print(f"hyserve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
