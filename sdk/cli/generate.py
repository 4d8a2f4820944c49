"""``octavo generate "prompt" ...``: complete prompts on the command line, streaming the text as it comes."""

from __future__ import annotations

import argparse
import sys


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=128, help="Most tokens to generate per prompt (default 128).")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0).")
    g.add_argument("--top-p", type=float, default=1.0, help="Nucleus sampling mass (default 1).")
    g.add_argument("--top-k", type=int, default=-1, help="Keep the k most likely tokens; -1 keeps all.")
    g.add_argument("--request-seed", type=int, default=None, help="Per-request sampling seed.")
    g.add_argument("--stop", action="append", default=None, help="Stop string (repeatable).")
    g.add_argument("--ignore-eos", action="store_true", help="Keep generating past the end-of-sequence token.")


def sampling_params_from_args(args):
    from octavo.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.request_seed, stop=args.stop, ignore_eos=args.ignore_eos,
                          output_kind=RequestOutputKind.DELTA)


def add_parser(subparsers) -> None:
    from octavo.cli.flags import add_settings_arguments

    p = subparsers.add_parser("generate", help="Complete prompts (streams the text).",
                              description="Complete one or more prompts with the model (default: the embedded "
                                          "SmolLM2-135M-Instruct) and print the completions.")
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="Prompt text ('-' reads one from stdin).")
    p.add_argument("--chat", action="store_true", help="Wrap each prompt as a user message in the chat template.")
    add_sampling_arguments(p)
    add_settings_arguments(p, sections=["model", "device", "cache", "scheduler"])
    p.set_defaults(func=run)


def run(args) -> int:
    from octavo.cli.flags import settings_from_args
    from octavo.llm_engine import LLMEngine

    params = sampling_params_from_args(args)
    engine = LLMEngine(settings_from_args(args))
    prompts = [sys.stdin.read() if p == "-" else p for p in args.prompts]
    for i, prompt in enumerate(prompts):
        if args.chat:
            prompt = {"prompt_token_ids": engine.render_chat(
                [{"role": "user", "content": prompt}])[1]}
        engine.add_request(str(i), prompt, params)
    texts = {str(i): "" for i in range(len(prompts))}
    stream = len(prompts) == 1
    while engine.has_unfinished_requests():
        for out in engine.step():
            delta = "".join(c.text for c in out.outputs)
            texts[out.request_id] += delta
            if stream:
                sys.stdout.write(delta)
                sys.stdout.flush()
    if stream:
        sys.stdout.write("\n")
    else:
        for i, prompt in enumerate(prompts):
            print(f"--- [{i}] {prompt!r}\n{texts[str(i)]}")
    engine.shutdown()
    return 0
