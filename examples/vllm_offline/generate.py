"""vLLM examples/offline_inference/basic/generate.py, import swapped: EngineArgs on a FlexibleArgumentParser,
sampling flags, LLM(**vars(args)), default sampling params from the model's generation config."""
from octavo import LLM, EngineArgs
from octavo.utils import FlexibleArgumentParser


def create_parser():
    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    group = parser.add_argument_group("Sampling parameters")
    group.add_argument("--max-tokens", type=int)
    group.add_argument("--temperature", type=float)
    group.add_argument("--top-p", type=float)
    group.add_argument("--top-k", type=int)
    return parser


def main(args: dict):
    max_tokens, temperature = args.pop("max_tokens"), args.pop("temperature")
    top_p, top_k = args.pop("top_p"), args.pop("top_k")
    llm = LLM(**{k: v for k, v in args.items() if v is not None})
    sampling_params = llm.get_default_sampling_params()
    for name, value in (("max_tokens", max_tokens), ("temperature", temperature), ("top_p", top_p),
                        ("top_k", top_k)):
        if value is not None:
            setattr(sampling_params, name, value)
    prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is",
               "The future of AI is"]
    for output in llm.generate(prompts, sampling_params):
        print(f"Prompt: {output.prompt!r}\nGenerated text: {output.outputs[0].text!r}\n" + "-" * 50)


if __name__ == "__main__":
    main(vars(create_parser().parse_args()))
