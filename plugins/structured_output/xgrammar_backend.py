"""The ``xgrammar`` structured-output backend (the default): JSON schema, regex, choice, EBNF/GBNF grammars,
any JSON object and structural tags, through xgrammar's compiler and per-request ``GrammarMatcher``.

``validate`` builds the tokenizer-free ``xgrammar.Grammar`` (milliseconds, in the front end) so a bad
schema, regex or grammar is a ``ValueError`` naming the field; ``compile`` builds the tokenizer-specific
``CompiledGrammar`` in the engine core. xgrammar's own compile cache is on as well.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from octavo.plugins.structured_output.xgrammar_schema import bounded_strings_as_patterns
from octavo.plugins.structured_output.xgrammar_whitespace import capped_whitespace_grammar
from octavo.structured_outputs import (
    GrammarMatcher,
    StructuredOutputBackend,
    StructuredOutputsParams,
    choice_regex,
)

MAX_WHITESPACE = 16
# threads of the native BatchGrammarMatcher one fill call runs on (its own C++ pool, GIL released); 1: the engine
# splits rows over its own threads instead (core/grammar_step.py). The benchmark's json_async_nt8 mode sets 8.
NATIVE_FILL_THREADS = 1
# read the batch accept's result back without FFI calls that release the GIL (_batch_accept); False: xgrammar's own
ACCEPT_READBACK_KEEPS_GIL = True
_READBACK: dict[str, Any] = {}
WHITESPACE_AS_REGEX = True  # False: xgrammar's own max_whitespace_cnt (same language; benchmarks compare both)


def _schema(params: StructuredOutputsParams) -> str:
    """The schema text xgrammar compiles: short bounded strings as their regex form (xgrammar_schema.py:
    the same JSON text, 100x cheaper masks). A string that is not JSON goes as it is (xgrammar names the error)."""
    schema = params.json
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return params.json
    return json.dumps(bounded_strings_as_patterns(schema))


def _build(xgr, params: StructuredOutputsParams, compiler=None):
    """One function for both: the tokenizer-free Grammar (compiler=None) or the CompiledGrammar."""
    kind = params.kind
    ws = not params.disable_any_whitespace
    # NOTE: free whitespace is capped per gap: small models otherwise loop on newlines inside a JSON value
    # until max_tokens (seen with SmolLM2 in chat); 16 characters still allow indented pretty-printing.
    cap = {"any_whitespace": ws, "max_whitespace_cnt": MAX_WHITESPACE if ws else None}
    if kind in ("json", "json_object"):
        schema = _schema(params) if kind == "json" else '{"type": "object"}'
        # the same cap as one regex rule: same masks, cheaper fills than xgrammar's ws{0, 16} (xgrammar_whitespace.py)
        ebnf = capped_whitespace_grammar(xgr, schema, MAX_WHITESPACE) if ws and WHITESPACE_AS_REGEX else None
        if ebnf is not None:
            return compiler.compile_grammar(ebnf) if compiler is not None else xgr.Grammar.from_ebnf(ebnf)
        if compiler is not None:
            return compiler.compile_json_schema(schema, **cap)
        return xgr.Grammar.from_json_schema(schema, **cap)
    if kind in ("regex", "choice"):
        regex = params.regex if kind == "regex" else choice_regex(params.choice)
        return compiler.compile_regex(regex) if compiler is not None else xgr.Grammar.from_regex(regex)
    if kind == "grammar":
        return compiler.compile_grammar(params.grammar) if compiler is not None else xgr.Grammar.from_ebnf(params.grammar)
    if kind == "structural_tag":
        tag = json.loads(params.structural_tag)
        if "structures" in tag:  # vLLM's legacy form: {"structures": [{begin, schema, end}], "triggers": [...]}
            items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                     for s in tag["structures"]]
            if compiler is not None:
                return compiler.compile_structural_tag(items, tag["triggers"])
            return xgr.Grammar.from_structural_tag(items, tag["triggers"])
        return compiler.compile_structural_tag(tag) if compiler is not None else xgr.Grammar.from_structural_tag(tag)
    raise ValueError(f"structured_outputs.{kind}: not supported by the xgrammar backend")


class _Matcher(GrammarMatcher):
    """An xgrammar matcher whose "terminated" state is kept in Python: an xgrammar matcher (built without
    ``terminate_without_stop_token``) terminates only by accepting one of its stop tokens, so the flag is read
    back from xgrammar only after such a token. Why: the engine asks every row of every step (before the accept
    and in the fill), and 32 calls through two Python layers into C++ were ~14% of the accept's time in a
    host-bound profile (py-spy, session 7), on the critical path of an async structured step."""

    __slots__ = ("m", "_stop", "terminated")

    def __init__(self, matcher: Any) -> None:
        self.m = matcher
        self._stop = frozenset(matcher.stop_token_ids)
        self.terminated = matcher.is_terminated()

    def accept_token(self, token_id: int) -> bool:
        ok = self.m.accept_token(token_id)
        if token_id in self._stop:
            self.terminated = self.m.is_terminated()
        return ok

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        self.m.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return self.terminated

    def reset(self) -> None:
        self.m.reset()
        self.terminated = self.m.is_terminated()


def _batch_accept(xgr: Any, matchers: list[Any], tokens: list[int]) -> list[bool]:
    """xgrammar's ``BatchGrammarMatcher.batch_accept_token`` without its per-element read-back of the result.

    Why: xgrammar turns the native result array into a list with two FFI calls per row (``len`` and the item),
    and tvm_ffi releases the GIL on every FFI call, so 32 rows were 64 GIL hand-off points on the engine core's
    thread while the runner's thread launches the next step (session 10 H200 stack samples: 6 % of the core
    thread in tvm_ffi's container code; 38 us per step alone on the 2-vCPU VM). Here the items are read by a
    private handle of the same FFI function that keeps the GIL (``ACCEPT_READBACK_KEEPS_GIL``): ~6 us, no
    release. Same call, same results; any internal name missing falls back to the public API."""
    getter = _READBACK.get("getter")
    if getter is None and ACCEPT_READBACK_KEEPS_GIL and not _READBACK.get("failed"):
        try:
            import tvm_ffi
            from xgrammar.base import _core

            getter = tvm_ffi.get_global_func("ffi.ArrayGetItem")  # a new handle: its flag is not the library's
            getter.release_gil = False
            _READBACK["core"], _READBACK["getter"] = _core, getter
        except Exception:  # noqa: BLE001 - another xgrammar / tvm_ffi layout: the public call below
            _READBACK["failed"] = True
    if getter is None or not ACCEPT_READBACK_KEEPS_GIL:
        return xgr.BatchGrammarMatcher.batch_accept_token(matchers, tokens)
    res = _READBACK["core"].BatchGrammarMatcher.batch_accept_token([m._handle for m in matchers], tokens, False)
    return [bool(getter(res, i)) for i in range(len(matchers))]


class XGrammarBackend(StructuredOutputBackend):
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        super().__init__(tokenizer, vocab_size)
        import xgrammar as xgr

        self.xgr = xgr
        info = self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=True)
        # one single-threaded BatchGrammarMatcher per filling thread (GIL released while it fills): the engine
        # splits a step's rows over its own threads (core/grammar_step.py); xgrammar's own 8 threads were no
        # faster than 1 on an H100 host (0.44 vs 0.38 ms for 32 rows, docs/performance.md)
        self._local = threading.local()

    @classmethod
    def is_available(cls) -> bool:
        import importlib.util

        return importlib.util.find_spec("xgrammar") is not None

    @classmethod
    def validate(cls, params: StructuredOutputsParams) -> None:
        import xgrammar as xgr

        try:
            _build(xgr, params)
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError/its own types
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            msg = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", msg)  # drop xgrammar's "[time] file.cc:line: "
            raise ValueError(f"structured_outputs.{params.kind}: cannot compile for xgrammar: {msg}") from None

    def compile(self, params: StructuredOutputsParams) -> Any:
        return _build(self.xgr, params, self.compiler)

    def out_of_process(self, rows: int) -> StructuredOutputBackend:
        """This backend with its matchers in a worker process (OCTAVO_GRAMMAR_WORKER=1, xgrammar_worker.py)."""
        from octavo.plugins.structured_output.xgrammar_worker import XGrammarWorkerBackend

        return XGrammarWorkerBackend(self, rows)

    def matcher(self, compiled: Any) -> GrammarMatcher:
        return _Matcher(self.xgr.GrammarMatcher(compiled))

    def accept_tokens(self, matchers: list[GrammarMatcher], tokens: list[int]) -> list[bool]:
        if len(matchers) > 1 and all(isinstance(m, _Matcher) for m in matchers):  # one C call for the step
            ok = _batch_accept(self.xgr, [m.m for m in matchers], tokens)
            for m, t in zip(matchers, tokens):
                if t in m._stop:  # (the only way an xgrammar matcher terminates: _Matcher)
                    m.terminated = m.m.is_terminated()
            return ok
        return super().accept_tokens(matchers, tokens)

    def fill_bitmasks(self, matchers: list[GrammarMatcher], bitmask: Any) -> None:
        batch = getattr(self._local, "batch", None)
        if batch is None or self._local.threads != NATIVE_FILL_THREADS:
            batch = self._local.batch = self.xgr.BatchGrammarMatcher(max_threads=NATIVE_FILL_THREADS)
            self._local.threads = NATIVE_FILL_THREADS
        fill_rows(self.xgr, batch, matchers, bitmask)


def fill_rows(xgr: Any, batch: Any, matchers: list[GrammarMatcher], bitmask: Any) -> None:
    """``bitmask[j]`` from ``matchers[j]``, live rows in one call of ``batch`` (a ``BatchGrammarMatcher``; also
    the grammar worker's fill, plugins/structured_output/xgrammar_worker.py)."""
    # a matcher that accepted its stop token (EOS under ignore_eos) constrains nothing more, as in vLLM:
    # its row is all ones (the engine then applies no mask); xgrammar raises if asked for its mask
    done = [m.is_terminated() for m in matchers]
    live = [j for j, d in enumerate(done) if not d]
    if len(live) < len(matchers):
        bitmask[[j for j, d in enumerate(done) if d]] = -1
    if len(live) > 1 and all(isinstance(matchers[j], _Matcher) for j in live):
        batch.batch_fill_next_token_bitmask([matchers[j].m for j in live], bitmask,
                                            indices=None if len(live) == len(matchers) else live)
    else:
        for j in live:
            matchers[j].fill_bitmask(bitmask, j)
