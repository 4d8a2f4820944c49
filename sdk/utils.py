"""Where vLLM scripts find ``FlexibleArgumentParser`` (``from vllm.utils import FlexibleArgumentParser``)."""

from octavo.engine_args import FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser"]
