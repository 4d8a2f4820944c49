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

from octavo.plugins.structured_output.xgrammar_match import _batch_accept, _Matcher, fill_rows
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
        # the last accept's matchers list, whether all are ours, their xgrammar matchers, native handles and stop
        # tokens: the engine passes the same list (never mutated) every steady decode step (core/grammar_rows.py),
        # so the per-row checks and lists are built once per batch, not once per step
        self._accept_rows: tuple = ((), False, None, None, frozenset())
        self._pending: _StartedFill | None = None  # the last started native fill (fill_open_start), until joined

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

    def _rows_of(self, matchers: list[GrammarMatcher]) -> tuple:
        """``(matchers, all ours, their xgrammar matchers, native handles, stop tokens)``, kept for the last list."""
        rows = self._accept_rows
        if rows[0] is not matchers:
            ours = len(matchers) > 1 and all(isinstance(m, _Matcher) for m in matchers)
            rows = self._accept_rows = (matchers, ours, [m.m for m in matchers] if ours else None,
                                        [m.h for m in matchers] if ours else None,
                                        frozenset().union(*[m._stop for m in matchers]) if ours else frozenset())
        return rows

    def accept_tokens(self, matchers: list[GrammarMatcher], tokens: list[int]) -> list[bool]:
        self.settle()  # (a started native fill is over before any matcher moves)
        rows = self._rows_of(matchers)
        if rows[1]:  # one C call for the step
            ok = _batch_accept(self.xgr, rows[2], tokens, rows[3])
            if not rows[4].isdisjoint(tokens):  # (a stop token is the only way an xgrammar matcher terminates)
                for m, t in zip(matchers, tokens):
                    if t in m._stop:
                        m.terminated = m.m.is_terminated()
            return ok
        return super().accept_tokens(matchers, tokens)

    def _batch_rows(self, matchers: list[GrammarMatcher]) -> tuple[Any, list | None]:
        """This thread's ``BatchGrammarMatcher`` and the xgrammar matchers of ``matchers`` (None: not all ours)."""
        batch = getattr(self._local, "batch", None)
        if batch is None or self._local.threads != NATIVE_FILL_THREADS:
            batch = self._local.batch = self.xgr.BatchGrammarMatcher(max_threads=NATIVE_FILL_THREADS)
            self._local.threads = NATIVE_FILL_THREADS
        rows = getattr(self._local, "rows", None)  # (as _accept_rows: the same list every steady step)
        if rows is None or rows[0] is not matchers:
            ours = len(matchers) > 1 and all(isinstance(m, _Matcher) for m in matchers)
            rows = self._local.rows = (matchers, [m.m for m in matchers] if ours else None)
        return batch, rows[1]

    def fill_bitmasks(self, matchers: list[GrammarMatcher], bitmask: Any) -> None:
        batch, inner = self._batch_rows(matchers)
        fill_rows(self.xgr, batch, matchers, bitmask, inner)

    def _native_tokens(self, matchers: list[GrammarMatcher], inner: list | None, accept: Any) -> list[int] | None:
        """``accept`` (N's tokens for these rows, core/grammar_accept.py) as the native call's per-row tokens when the
        C call can take it (the same list, all ours, no row terminated, no stop token: the terminated flag then
        stays right); else it runs here first, in Python (None)."""
        if accept is None or accept.done:
            return None
        if (inner is not None and accept.matchers is matchers and self._rows_of(matchers)[4].isdisjoint(accept.tokens)
                and not any([m.terminated for m in matchers])):
            accept.done = True
            return accept.tokens
        accept()
        return None

    def _native(self, batch: Any, started: bool) -> Any:
        from octavo.plugins.structured_output import xgrammar_native as xn

        native = getattr(self._local, "native", None)
        if (native is None or native.batch is not batch or native.threads != xn.POOL_THREADS
                or native.started != started or native.spin_us != xn.SPIN_US):
            self.settle()
            native = self._local.native = xn.NativeFill(batch, xn.POOL_THREADS, started)
        return native

    def fill_open(self, matchers: list[GrammarMatcher], bitmask: Any, words: Any, seq: int, accept: Any = None) -> float:
        """The device-gated fill with the gate word opened from C right after it (core/grammar_step.py NATIVE_OPEN,
        xgrammar_native.py): perf_counter seconds when the word opened, 0.0 when it did not (rows with a terminated
        matcher or not all ours go through :meth:`fill_bitmasks`; a failed native call is filled again that way,
        which raises xgrammar's error or fills): the caller then opens it. ``accept`` (session 15, opt-in
        OCTAVO_GRAMMAR_NATIVE_ACCEPT): the previous step's tokens, accepted row by row in the same C call."""
        batch, inner = self._batch_rows(matchers)
        tokens = self._native_tokens(matchers, inner, accept)
        if inner is not None and not any([m.terminated for m in matchers]):
            native = self._native(batch, False)
            t_end = native(inner, bitmask, words, seq, tokens)
            if tokens is not None:
                accept.native(native.accepted(len(inner)))
            if t_end:
                return t_end
        fill_rows(self.xgr, batch, matchers, bitmask, inner)
        return 0.0

    def fill_open_start(self, matchers: list[GrammarMatcher], bitmask: Any, words: Any, seq: int,
                        accept: Any = None) -> Any:
        """Session 15 (opt-in OCTAVO_GRAMMAR_NATIVE_START): :meth:`fill_open` handed to the shim's threads and not
        waited for: a job whose ``join()`` returns as :meth:`fill_open` does (call it before the matchers or the rows
        are touched again; :meth:`accept_tokens` and :meth:`settle` do); None where it cannot start (nothing done
        but maybe ``accept``: then :meth:`fill_open`)."""
        batch, inner = self._batch_rows(matchers)
        if inner is None or any([m.terminated for m in matchers]):
            return None
        self.settle()
        tokens = self._native_tokens(matchers, inner, accept)
        if tokens is None and any([m.terminated for m in matchers]):  # (a stop token accepted just now, in Python)
            return None
        native = self._native(batch, True)
        if not native.start(inner, bitmask, words, seq, tokens):
            if tokens is not None:
                accept.done = False  # (not taken: fill_open accepts them)
            return None
        job = self._pending = _StartedFill(self, native, matchers, bitmask, accept if tokens is not None else None)
        return job

    def chain_job(self, matchers: list[GrammarMatcher], bitmask: Any) -> Any:
        """Session 16 (opt-in OCTAVO_GRAMMAR_CHAIN, core/grammar_chain.py): a job that accepts the previous step's
        tokens into ``matchers``, fills ``bitmask`` and opens the gate word in one C call the CUDA driver runs
        (xgrammar_chain.py); None where it cannot (not all ours, a row terminated, every slot in flight)."""
        from octavo.plugins.structured_output.xgrammar_chain import ChainRing

        if any([m.terminated for m in matchers]):
            return None
        ring = getattr(self._local, "chain", None)  # the steady step: the same list and rows as the last job's
        if (ring is not None and ring.matchers is matchers and ring.native is getattr(self._local, "native", None)
                and ring.key is ring.native._key and ring.rows_ptr == bitmask.data_ptr()):  # noqa: SLF001
            return ring.take(matchers)
        batch, inner = self._batch_rows(matchers)
        if inner is None:
            return None
        native = self._native(batch, False)
        native._prepare(inner, bitmask)  # noqa: SLF001 - (a cache hit while the batch is unchanged)
        if native.accept_fn is None:
            return None
        if ring is None or ring.native is not native or ring.key is not native._key:  # noqa: SLF001
            ring = self._local.chain = ChainRing(native, inner)
        ring.matchers, ring.rows_ptr = matchers, bitmask.data_ptr()
        return ring.take(matchers)

    def chain_refill(self, job: Any, matchers: list[GrammarMatcher], bitmask: Any) -> None:
        """A chained job the C side left to the host (a row terminated, an accept or a fill failed): the matchers'
        terminated flags from its results, then every row filled through the Python API (a terminated row all ones;
        xgrammar's own error raised)."""
        _, term = job.results()
        for m, t in zip(matchers, term):
            if t:
                m.terminated = m.m.is_terminated()
        batch, inner = self._batch_rows(matchers)
        fill_rows(self.xgr, batch, matchers, bitmask, inner)

    def settle(self) -> None:
        """A started native fill of this backend over (its error, if any, stays with its job for the step)."""
        job, self._pending = self._pending, None
        if job is not None:
            try:
                job.join()
            except Exception:  # noqa: BLE001 - raised again by the step's own join (GrammarStep.settle)
                pass

    def close(self) -> None:
        self.settle()

    @staticmethod
    def check_fill_open() -> None:
        """Build the native fill + open and fill a tiny grammar with it: ``RuntimeError`` with the reason where it
        cannot run (the engine then refuses OCTAVO_GRAMMAR_NATIVE_OPEN=1 by name)."""
        from octavo.plugins.structured_output.xgrammar_native import clock_matches, self_test

        self_test()  # (builds the shim first)
        if not clock_matches():
            raise RuntimeError("time.perf_counter is not CLOCK_MONOTONIC here (the shim's stamps would not compare)")


class _StartedFill:
    """A native fill handed to the shim's threads (:meth:`XGrammarBackend.fill_open_start`): ``join()`` waits for it
    once (any thread; later calls give the same answer), reports the C accept's results, and on a failed native call
    fills again through xgrammar's Python API (its error is raised, here and by every later ``join()``)."""

    __slots__ = ("backend", "native", "matchers", "bitmask", "accept", "result", "lock")

    def __init__(self, backend: XGrammarBackend, native: Any, matchers: list, bitmask: Any, accept: Any) -> None:
        self.backend, self.native, self.matchers, self.bitmask, self.accept = backend, native, matchers, bitmask, accept
        self.result: Any = None
        self.lock = threading.Lock()

    def join(self) -> float:
        with self.lock:
            if self.result is None:
                try:
                    t_end = self.native.join()
                    if not t_end:  # (the word stays closed: the caller opens it after this)
                        batch, inner = self.backend._batch_rows(self.matchers)
                        fill_rows(self.backend.xgr, batch, self.matchers, self.bitmask, inner)
                    self.result = t_end
                    if self.accept is not None:  # (refused tokens: warnings; a failed accept call raises)
                        self.accept.native(self.native.accepted(len(self.matchers)))
                except Exception as e:  # noqa: BLE001 - kept: every join raises it (the step fails on the host)
                    self.result = e
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result
