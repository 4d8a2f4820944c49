"""``octavo chat``: an interactive conversation in the terminal, using the model's chat template."""

from __future__ import annotations

import sys


def add_parser(subparsers) -> None:
    from octavo.cli.flags import add_settings_arguments
    from octavo.cli.generate import add_sampling_arguments

    p = subparsers.add_parser("chat", help="Chat with the model interactively.",
                              description="Chat with the model in the terminal. Type /exit or Ctrl-D to leave, "
                                          "/reset to start over.")
    p.add_argument("--system", default=None, help="A system message to start the conversation with.")
    add_sampling_arguments(p)
    add_settings_arguments(p, sections=["model", "device", "cache", "scheduler"])
    p.set_defaults(func=run, max_tokens=512)


def run(args) -> int:
    from octavo.cli.flags import settings_from_args
    from octavo.cli.generate import sampling_params_from_args
    from octavo.llm_engine import LLMEngine

    params = sampling_params_from_args(args)
    engine = LLMEngine(settings_from_args(args))
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    turn = 0
    interactive = sys.stdin.isatty()
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        if line.strip() in ("/exit", "/quit"):
            break
        if line.strip() == "/reset":
            messages = list(start)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        _, ids = engine.render_chat(messages)
        try:
            engine.add_request(f"turn-{turn}", {"prompt_token_ids": ids}, params)
        except ValueError as e:  # e.g. the conversation outgrew max_model_len
            print(f"error: {e}", file=sys.stderr)
            messages.pop()
            continue
        turn += 1
        reply = ""
        while engine.has_unfinished_requests():
            for out in engine.step():
                delta = out.outputs[0].text
                reply += delta
                sys.stdout.write(delta)
                sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": reply})
    engine.shutdown()
    return 0
