"""The modes of benchmarks/structured_outputs.py's decode run: what each one switches in the engine, and putting the
engine's defaults back after it. A mode is ``(structured outputs params or None, async scheduling on, fill before
the step, xgrammar's own maxLength form, GIL switch interval or None, engine knobs)``; the knobs are module flags of
core/grammar_step.py, core/async_gate.py, core/grammar_device_gate.py, core/structured_output.py and the xgrammar
backend, and attributes of the engine's async loop. Each mode's comment says which session added it and why.
"""

from __future__ import annotations

from typing import Any

from structured_common import SCHEMA

MODE_KEYS = ("inline", "handoff", "threads", "kernel", "early")  # the knobs every mode states (``dflt``)


def defaults(core: Any) -> dict:
    """The engine's own knob values, what :func:`restore` puts back; ``{k: v[k] for k in MODE_KEYS}`` is the
    ``dflt`` every mode starts from (the others are set only by the modes that name them)."""
    from octavo.core import async_gate, grammar_chain, grammar_device_gate, grammar_step
    from octavo.core import structured_output as so_mod

    return {"park": async_gate.PARK, "early_fill": async_gate.EARLY_FILL, "start_wait": async_gate.FILL_START_WAIT_S,
            "devgate_start_wait": async_gate.DEVICE_GATE_FILL_START_WAIT_S,
            "devgate": grammar_device_gate.DEVICE_GATE, "graph": grammar_device_gate.GRAPH,
            "poolaccept": so_mod.ACCEPT_ON_FILL_THREAD, "yield": so_mod.YIELD_AFTER_RELEASE,
            "native_open": grammar_device_gate.NATIVE_OPEN, "accept_gil": _xgm().ACCEPT_KEEPS_GIL,
            "pool": _native_module().POOL_THREADS, "spin": _native_module().SPIN_US, "inline_native": async_gate.NATIVE_OPEN_INLINE,
            "nstart": grammar_device_gate.NATIVE_START, "naccept": grammar_device_gate.NATIVE_ACCEPT,
            "chain": grammar_chain.CHAIN, "inline": grammar_step.INLINE_AFTER_GATE, "handoff": grammar_step.HANDOFF_WAIT_S,
            "threads": core.structured.fill_threads, "kernel": grammar_step.PLATFORM_APPLY,
            "early": so_mod.EARLY_ACCEPT}


def build_modes(args: Any, so: Any, dflt: dict) -> dict:
    """Every mode this run takes (``args.modes`` filters; ``free`` / ``free_async`` and the free baseline of a
    ``_old`` / ``_noearly`` / ``_d3`` / ``_wait`` mode always run). ``so``: the JSON schema's params."""
    from octavo.structured_outputs import StructuredOutputsParams

    modes = {"free": (None, False, False, False, None, dflt), "overlap": (so, False, False, False, None, dflt),
             "serial": (so, False, True, False, None, dflt),
             # the core's own apply instead of the platform's (CPU: numpy AND/OR with operands the fill builds,
             # session 5-6; the C pass over the packed words is the default since session 7)
             "overlap_coreapply": (so, False, False, False, None, {**dflt, "kernel": False})}
    if args.backend == "xgrammar" and args.compare_maxlength:
        # xgrammar's own maxLength form (before the regex rewrite): a different schema text, so its own cache key
        modes["overlap_maxlength"] = (StructuredOutputsParams(json={**SCHEMA, "description": "maxLength form"}),
                                      False, False, True, None, dflt)
    if "on" in (args.async_modes or []):
        modes["free_async"] = (None, True, False, False, None, dflt)
        modes["json_async"] = (so, True, False, False, None, dflt)
        # the async variants of session 5's changes: the fill queued on the bitmask thread (session 4's path),
        # inline but no hand-off wait, and inline on one thread (no row split)
        modes["json_async_pool"] = (so, True, False, False, None, {**dflt, "inline": False})
        modes["json_async_nohandoff"] = (so, True, False, False, None, {**dflt, "handoff": 0.0})
        modes["json_async_t1"] = (so, True, False, False, None, {**dflt, "threads": 1})
        # session 8: one native fill call on xgrammar's own 8-thread pool (xgrammar_backend.NATIVE_FILL_THREADS)
        modes["json_async_nt8"] = (so, True, False, False, None, {**dflt, "threads": 1, "native": 8})
        # the pinned rows copied to the device before the apply (session 7), not read by the device directly
        modes["json_async_copy"] = (so, True, False, False, None, {**dflt, "host_read": False})
        modes["json_async_table"] = (so, True, False, False, None, {**dflt, "kernel": False})  # the core's apply
        modes["json_async_late"] = (so, True, False, False, None, {**dflt, "early": False})  # accept after update
        # diagnostic: the async grammar path with no-op fill and accept (rows all open; the text is unconstrained)
        modes["json_async_gateonly"] = (so, True, False, False, None, {**dflt, "gate_only": True})
        # session 6: the step loop before it (no early launch of N+2, the runner blocking on the gate; vs free_async_old)
        modes["free_async_old"] = (None, True, False, False, None, {**dflt, "old_loop": True})
        modes["json_async_old"] = (so, True, False, False, None, {**dflt, "old_loop": True})
        # one of the two session-6 changes at a time: early launch without parking, parking without early launch
        modes["json_async_nopark"] = (so, True, False, False, None, {**dflt, "park": False})
        modes["json_async_noearly"] = (so, True, False, False, None, {**dflt, "early_launch": False})
        modes["free_async_noearly"] = (None, True, False, False, None, {**dflt, "early_launch": False})
        # N+1's fill started on the bitmask thread right after N's accept, overlapping update(N) + schedule(N+2)
        modes["json_async_earlyfill"] = (so, True, False, False, None, {**dflt, "early_fill": True})
        modes["json_async_noearlyfill"] = (so, True, False, False, None, {**dflt, "early_fill": False})
        # session 7: without the GIL switch interval the loop can set while a structured step is in flight (on an
        # accelerator; core/async_engine.py GRAMMAR_SWITCH_INTERVAL_S, 0 = off by default since session 7 batch 1)
        modes["json_async_noswitch"] = (so, True, False, False, None, {**dflt, "switch": 0.0})
        # the early fill without the core thread's wait (up to 1 ms) until the bitmask thread is inside the fill
        modes["json_async_nostartwait"] = (so, True, False, False, None, {**dflt, "start_wait": 0.0})
        for us in (50, 100, 200, 500, 1000):  # that switch on at these intervals (json_async_sw50us, ...)
            modes[f"json_async_sw{us}us"] = (so, True, False, False, None, {**dflt, "switch": us * 1e-6})
        # the core thread waits (up to 5 ms) until the step thread queued N+2 before building N's outputs
        modes["free_async_wait"] = (None, True, False, False, None, {**dflt, "launch_wait": 0.005})
        modes["json_async_wait"] = (so, True, False, False, None, {**dflt, "launch_wait": 0.005})
        # experiment: three steps in flight (AsyncStepLoop.depth = 3): N+2 queued before N's tokens arrive (vs free_async_d3)
        modes["free_async_d3"] = (None, True, False, False, None, {**dflt, "depth": 3})
        modes["json_async_d3"] = (so, True, False, False, None, {**dflt, "depth": 3})
        # session 9: the device gate (core/grammar_device_gate.py): sampling queued behind a device wait on a host
        # word the fill opens, instead of parked on the Python gate; _inline: the fill on the core thread at the
        # accept (no early fill on the bitmask thread); json_async_park: the Python gate (sessions 6-8)
        modes["json_async_devgate"] = (so, True, False, False, None, {**dflt, "devgate": True})
        modes["json_async_devgate_inline"] = (so, True, False, False, None, {**dflt, "devgate": True,
                                                                               "early_fill": False})
        modes["json_async_park"] = (so, True, False, False, None, {**dflt, "devgate": False})
        # the device gate with N's accept moved into the bitmask thread's fill job (structured_output
        # ACCEPT_ON_FILL_THREAD), and with a 0.2 ms GIL switch interval while structured steps are in flight
        modes["json_async_devgate_poolaccept"] = (so, True, False, False, None, {**dflt, "devgate": True,
                                                                                   "poolaccept": True})
        modes["json_async_devgate_sw200us"] = (so, True, False, False, None, {**dflt, "devgate": True,
                                                                                "switch": 200e-6})
        # session 11: xgrammar's own read-back of the batch accept's result (two GIL-releasing FFI calls per row)
        # instead of the engine's (xgrammar_backend.ACCEPT_READBACK_KEEPS_GIL, the default since session 11)
        modes["json_async_xgraccept"] = (so, True, False, False, None, {**dflt, "readback": False})
        # experiment: xgrammar's batch accept call keeps the GIL (~20-50 us of C++ at batch 32) instead of releasing
        # it, so the core thread does not queue for the GIL behind the runner's thread when the call returns
        modes["json_async_acceptgil"] = (so, True, False, False, None, {**dflt, "accept_gil": True})
        # session 11: the matchers in a grammar worker process (OCTAVO_GRAMMAR_WORKER, xgrammar_worker.py), device gate
        modes["json_async_worker"] = (so, True, False, False, None, {**dflt, "devgate": True, "worker": True})
        # diagnostic floor (session 11): the device gate where this process does no grammar work at all after the
        # prepare: no accept, no bitmask thread, no fill; the core thread opens the device's wait at once (rows all
        # open). What is left is the structure a grammar worker process would leave behind (prepare, the token
        # walk of accept_sampled, the runner's wait + apply launches); its text is unconstrained
        modes["json_async_devgate_postonly"] = (so, True, False, False, None, {**dflt, "devgate": True,
                                                                                 "gate_only": True, "post_only": True})
        # session 12: the device gate's wait + apply as one CUDA-graph replay (grammar_device_gate.GRAPH, opt-in), alone
        # and on the no-grammar-work floor
        modes["json_async_graph"] = (so, True, False, False, None, {**dflt, "devgate": True, "graph": True})
        # (the default since session 12's batch 1; _nograph: the two launches, sessions 9-11's path; _worker_graph:
        # the grammar worker process on top; _graph_nt8: one native fill call on xgrammar's 8-thread pool)
        modes["json_async_nograph"] = (so, True, False, False, None, {**dflt, "devgate": True, "graph": False})
        modes["json_async_worker_graph"] = (so, True, False, False, None, {**dflt, "devgate": True, "worker": True,
                                                                             "graph": True})
        modes["json_async_graph_nt8"] = (so, True, False, False, None, {**dflt, "devgate": True, "graph": True,
                                                                          "threads": 1, "native": 8})
        modes["json_async_graph_poolaccept"] = (so, True, False, False, None, {**dflt, "devgate": True, "graph": True,
                                                                                 "poolaccept": True})
        modes["json_async_devgate_postonly_graph"] = (so, True, False, False, None, {
            **dflt, "devgate": True, "gate_only": True, "post_only": True, "graph": True})
        # session 12: no time.sleep(0) after releasing N+1's fill (structured_output.YIELD_AFTER_RELEASE), alone and
        # on the floor (where the yield has no fill thread to hand the GIL to)
        modes["json_async_noyield"] = (so, True, False, False, None, {**dflt, "devgate": True, "yield": False})
        modes["json_async_graph_noyield"] = (so, True, False, False, None, {**dflt, "devgate": True, "graph": True,
                                                                             "yield": False})
        modes["json_async_devgate_postonly_noyield"] = (so, True, False, False, None, {
            **dflt, "devgate": True, "gate_only": True, "post_only": True, "yield": False})
        # the device gate with no-op fill and accept (rows all open, nothing constrained): the floor of its structure
        modes["json_async_devgate_gateonly"] = (so, True, False, False, None, {**dflt, "devgate": True,
                                                                                 "gate_only": True})
        # the device gate without the core thread's wait (up to 1 ms) until the bitmask thread is inside the fill
        # (session 12 batch 2's mode; the default since session 13), and with it (sessions 6-12's default): the
        # quiet-GPU confirmation of that default compares json_async with json_async_devgate_startwait
        modes["json_async_devgate_nostartwait"] = (so, True, False, False, None, {**dflt, "devgate": True,
                                                                                    "devgate_start_wait": 0.0})
        modes["json_async_devgate_startwait"] = (so, True, False, False, None, {**dflt, "devgate": True,
                                                                                  "devgate_start_wait": 0.001})
        # session 14: the device-gated fill called from C, which opens the gate word itself (grammar_device_gate
        # NATIVE_OPEN, plugins/structured_output/xgrammar_native.py): no GIL between the fill's end and the device's
        # go. Each mode states where the fill runs ("inline": async_gate.NATIVE_OPEN_INLINE, at the accept on the core
        # thread, the engine's choice with NATIVE_OPEN since the s14 GPU run; else on the bitmask thread) and in how
        # many chunks ("pool": xgrammar_native.POOL_THREADS, the caller + persistent C threads of the shim, no GIL, no
        # thread made per call). _nt4: xgrammar's own 4-thread pool (threads made per call); json_async_nt4: alone
        nat = {**dflt, "devgate": True, "native_open": True, "inline_native": False, "pool": 1}
        # the Python fill on the bitmask thread: sessions 13-14's default before the native fill + open
        modes["json_async_pyfill"] = (so, True, False, False, None, {**dflt, "native_open": False})
        modes["json_async_nativeopen"] = (so, True, False, False, None, nat)
        modes["json_async_nativeopen_nt4"] = (so, True, False, False, None, {**nat, "native": 4})
        modes["json_async_nt4"] = (so, True, False, False, None, {**dflt, "devgate": True, "native": 4})
        for k in (4, 8):
            modes[f"json_async_nativeopen_p{k}"] = (so, True, False, False, None, {**nat, "pool": k})
        # ... and that fill run on the core thread at the accept: no thread hop before the fill, the core thread waits
        # for it (GIL released) before update N + schedule N+2. s14 GPU run: this one (then early_fill off) won
        modes["json_async_nativeopen_p4_inline"] = (so, True, False, False, None, {**nat, "pool": 4,
                                                                                    "inline_native": True})
        # diagnostic: no grammar work left on the core thread's path to update N + schedule N+2: N's accept moves into
        # the fill job (structured_output.ACCEPT_ON_FILL_THREAD) and keeps the GIL for its ~5 us of C (else that thread
        # queues for the GIL behind the core thread: 0.69 ms, session 7); then the native fill + open in 4 chunks
        modes["json_async_nativeopen_p4_poolaccept"] = (so, True, False, False, None, {
            **nat, "pool": 4, "poolaccept": True, "accept_gil": True})
        # probes (session 14): device events around the wait + apply graph (grammar_device_gate.TIME_WAIT), so
        # "device_wait" says how long the device idled for the fill per step, as shipped and with the native open
        modes["json_async_probe"] = (so, True, False, False, None, {**dflt, "probe": True})
        modes["json_async_nativeopen_p4_probe"] = (so, True, False, False, None, {**nat, "pool": 4, "probe": True})
        modes["json_async_nativeopen_p4_inline_probe"] = (so, True, False, False, None, {
            **nat, "pool": 4, "inline_native": True, "probe": True})
        # ... and with the core thread's native accept keeping the GIL (~5 us of C at batch 32), so it does not queue
        # for the GIL again behind the runner's thread on its way to N+1's fill (session 11's _acceptgil, busy lane)
        modes["json_async_nativeopen_acceptgil"] = (so, True, False, False, None, {**nat, "accept_gil": True})
        # session 15 (json_async: the native fill + open at the accept, 4 chunks): (b) 8 chunks; (a) N's accept in N+1's
        # C fill call (grammar_device_gate.NATIVE_ACCEPT); (c) that call not waited for by the core thread (NATIVE_START)
        for k in (1, 2, 8):  # (the s15 call-3 A/B: shorter fills lost; does a longer one win?)
            modes[f"json_async_p{k}"] = (so, True, False, False, None, {**dflt, "pool": k})
        modes["json_async_naccept"] = (so, True, False, False, None, {**dflt, "naccept": True})
        modes["json_async_start"] = (so, True, False, False, None, {**dflt, "nstart": True})
        modes["json_async_start_naccept"] = (so, True, False, False, None, {**dflt, "nstart": True, "naccept": True})
        modes["json_async_start_naccept_p8"] = (so, True, False, False, None, {**dflt, "nstart": True,
                                                                                 "naccept": True, "pool": 8})
        modes["json_async_start_naccept_p2"] = (so, True, False, False, None, {**dflt, "nstart": True,
                                                                                 "naccept": True, "pool": 2})
        modes["json_async_start_naccept_noyield"] = (so, True, False, False, None, {
            **dflt, "nstart": True, "naccept": True, "yield": False})
        # session 14's path whatever the defaults (the fill waited for, the accept in Python, no poll), and a probe
        modes["json_async_waited"] = (so, True, False, False, None, {**dflt, "nstart": False, "naccept": False,
                                                                      "spin": 0.0})
        modes["json_async_start_naccept_probe"] = (so, True, False, False, None, {**dflt, "nstart": True,
                                                                                    "naccept": True, "probe": True})
        # (e) the wait + apply graph launched by three CUDA driver calls keeping the GIL (cuda_grammar_mask.DIRECT_LAUNCH),
        # alone and on the no-grammar-work floor
        modes["json_async_direct"] = (so, True, False, False, None, {**dflt, "direct": True})
        modes["json_async_nodirect"] = (so, True, False, False, None, {**dflt, "direct": False})
        modes["json_async_devgate_postonly_direct"] = (so, True, False, False, None, {
            **dflt, "devgate": True, "gate_only": True, "post_only": True, "direct": True})
        # session 16: the chained fill (core/grammar_chain.py: N's accept + N+1's fill run by the driver), + no yield
        modes["json_async_chain"] = (so, True, False, False, None, {**dflt, "chain": True})
        modes["json_async_chain_noyield"] = (so, True, False, False, None, {**dflt, "chain": True, "yield": False})
        # (d) the shim's idle workers poll 2 ms for the next call before they sleep (xgrammar_native.SPIN_US)
        modes["json_async_spin"] = (so, True, False, False, None, {**dflt, "spin": 2000.0})
        modes["json_async_naccept_spin"] = (so, True, False, False, None, {**dflt, "naccept": True, "spin": 2000.0})
        modes["json_async_start_naccept_spin"] = (so, True, False, False, None, {**dflt, "nstart": True,
                                                                                   "naccept": True, "spin": 2000.0})
        # session 10: the device gate with three steps in flight: N+2 is scheduled and its forward, wait, apply and
        # sampler are queued before N's tokens reach the host (the runner never parks under the device gate), so
        # the host chain N's tokens -> accept -> fill N+1 -> schedule N+3 has two device steps to hide in, not one.
        # H100 (s10 batch 1b): no faster than depth 2 (135M 2.08 vs 2.01 ms), so not adopted
        modes["json_async_devgate_d3"] = (so, True, False, False, None, {**dflt, "devgate": True, "depth": 3})
        if args.switch_interval:  # the same two with a shorter GIL switch interval (sys.setswitchinterval)
            modes["free_async_si"] = (None, True, False, False, args.switch_interval, dflt)
            modes["json_async_si"] = (so, True, False, False, args.switch_interval, dflt)
    if args.modes:
        keep = ("free", "free_async", "free_async_si", *(m.replace("json_", "free_", 1) for m in args.modes
                                                          if m.endswith(("_old", "_noearly", "_d3", "_wait"))))
        modes = {m: v for m, v in modes.items() if m in args.modes or m in keep}
    return modes


def apply_knobs(core: Any, knobs: dict, on: bool, async_modes: bool, saved: dict) -> None:
    """Switch the idle engine to a mode's knobs (``on``: async scheduling; ``saved``: :func:`defaults`)."""
    import octavo.plugins.structured_output.xgrammar_backend as xgb
    import octavo.plugins.structured_output.xgrammar_match as xgm
    from octavo.core import async_gate, grammar_chain, grammar_device_gate, grammar_step
    from octavo.core import structured_output as so_mod

    if async_modes:
        from octavo.core.async_engine import set_async_scheduling

        set_async_scheduling(core, on)
        if on and knobs.get("depth"):
            core.async_loop.depth = knobs["depth"]
        if on:
            old = knobs.get("old_loop", False)
            core.async_loop.early_launch = knobs.get("early_launch", not old)
            async_gate.PARK = knobs.get("park", not old)
            async_gate.EARLY_FILL = knobs.get("early_fill", saved["early_fill"] and not old)
            if "launch_wait" in knobs:
                core.async_loop.launch_wait_s = knobs["launch_wait"]
            if "switch" in knobs:  # GIL switch interval while a structured step is in flight (0: off)
                core.async_loop.grammar_switch_s = knobs["switch"]
            async_gate.FILL_START_WAIT_S = knobs.get("start_wait", saved["start_wait"])
            async_gate.DEVICE_GATE_FILL_START_WAIT_S = knobs.get("devgate_start_wait", saved["devgate_start_wait"])
    grammar_step.INLINE_AFTER_GATE, grammar_step.HANDOFF_WAIT_S = knobs["inline"], knobs["handoff"]
    grammar_step.PLATFORM_APPLY, so_mod.EARLY_ACCEPT = knobs["kernel"], knobs["early"]
    core.structured.fill_threads = knobs["threads"]
    xgb.NATIVE_FILL_THREADS = knobs.get("native", 1)
    grammar_step.HOST_READ_APPLY = knobs.get("host_read", True)
    grammar_device_gate.DEVICE_GATE = knobs.get("devgate", saved["devgate"])
    grammar_device_gate.GRAPH = knobs.get("graph", saved["graph"])
    so_mod.ACCEPT_ON_FILL_THREAD = knobs.get("poolaccept", saved["poolaccept"])
    so_mod.YIELD_AFTER_RELEASE = knobs.get("yield", saved["yield"])
    grammar_device_gate.NATIVE_OPEN = knobs.get("native_open", saved["native_open"])
    grammar_device_gate.TIME_WAIT = knobs.get("probe", saved.get("time_wait", False))
    _native_module().POOL_THREADS = knobs.get("pool", saved["pool"])
    _native_module().SPIN_US = knobs.get("spin", saved["spin"])
    async_gate.NATIVE_OPEN_INLINE = knobs.get("inline_native", saved["inline_native"])
    grammar_device_gate.NATIVE_START = knobs.get("nstart", saved["nstart"])
    grammar_device_gate.NATIVE_ACCEPT = knobs.get("naccept", saved["naccept"])
    grammar_chain.CHAIN = knobs.get("chain", saved["chain"])
    xgm.ACCEPT_READBACK_KEEPS_GIL = knobs.get("readback", True)
    xgm.ACCEPT_KEEPS_GIL = knobs.get("accept_gil", saved["accept_gil"])  # (set on the call on the next accept)
    if "direct" in knobs:
        _set_direct(knobs["direct"])
    if knobs.get("gate_only"):
        backend = core.structured._get_backend()
        backend.fill_bitmasks = lambda ms, bm: bm.fill_(-1)
        backend.accept_tokens = lambda ms, toks: [True] * len(ms)
    _use_worker(core, knobs.get("worker", False), saved)
    if knobs.get("post_only"):  # (the native fill + open at the accept would bypass it: off, s15)
        grammar_step.GrammarStep.start_on_pool = _post_only
        grammar_device_gate.NATIVE_OPEN = False


def _set_direct(on: bool) -> None:
    """cuda_grammar_mask.DIRECT_LAUNCH (a CUDA platform module: touched only by the modes that name it)."""
    from octavo.plugins.platforms import cuda_grammar_mask

    _DIRECT.setdefault("saved", cuda_grammar_mask.DIRECT_LAUNCH)
    cuda_grammar_mask.DIRECT_LAUNCH = on


_DIRECT: dict = {}  # "saved": the engine's value, put back by restore()


def restore(core: Any, saved: dict) -> None:
    """The engine's defaults back after a mode (async scheduling is left as the mode set it)."""
    import octavo.plugins.structured_output.xgrammar_backend as xgb
    import octavo.plugins.structured_output.xgrammar_match as xgm
    from octavo.core import async_gate, grammar_chain, grammar_device_gate, grammar_step
    from octavo.core import structured_output as so_mod

    grammar_step.INLINE_AFTER_GATE, grammar_step.HANDOFF_WAIT_S = saved["inline"], saved["handoff"]
    grammar_step.PLATFORM_APPLY, so_mod.EARLY_ACCEPT = saved["kernel"], saved["early"]
    core.structured.fill_threads = saved["threads"]
    xgb.NATIVE_FILL_THREADS = 1
    xgm.ACCEPT_READBACK_KEEPS_GIL = True
    xgm.ACCEPT_KEEPS_GIL = saved["accept_gil"]
    _accept_call().release_gil = not saved["accept_gil"]
    grammar_step.HOST_READ_APPLY = True
    grammar_device_gate.DEVICE_GATE = saved["devgate"]
    grammar_device_gate.GRAPH = saved["graph"]
    so_mod.ACCEPT_ON_FILL_THREAD = saved["poolaccept"]
    so_mod.YIELD_AFTER_RELEASE = saved["yield"]
    grammar_device_gate.NATIVE_OPEN = saved["native_open"]
    grammar_device_gate.TIME_WAIT = saved.get("time_wait", False)
    _native_module().POOL_THREADS = saved["pool"]
    _native_module().SPIN_US = saved["spin"]
    async_gate.NATIVE_OPEN_INLINE = saved["inline_native"]
    grammar_device_gate.NATIVE_START, grammar_device_gate.NATIVE_ACCEPT = saved["nstart"], saved["naccept"]
    grammar_chain.CHAIN = saved["chain"]
    async_gate.PARK, async_gate.EARLY_FILL = saved["park"], saved["early_fill"]
    async_gate.FILL_START_WAIT_S = saved["start_wait"]
    async_gate.DEVICE_GATE_FILL_START_WAIT_S = saved["devgate_start_wait"]
    grammar_step.GrammarStep.start_on_pool = _START_ON_POOL
    if "saved" in _DIRECT:
        from octavo.plugins.platforms import cuda_grammar_mask

        cuda_grammar_mask.DIRECT_LAUNCH = _DIRECT["saved"]
    if "inner_backend" in saved:
        _use_worker(core, False, saved)
    backend = core.structured._backend
    for name in ("fill_bitmasks", "accept_tokens"):  # the gate_only no-ops (instance attributes)
        if backend is not None and name in vars(backend):
            delattr(backend, name)


def _use_worker(core: Any, on: bool, saved: dict) -> None:
    """The idle engine's structured outputs with (``on``) or without the grammar worker process: each backend keeps
    its own fill buffer and device gate (a gate's step numbers must keep rising over its words)."""
    st = core.structured
    inner = saved.setdefault("inner_backend", st._get_backend())
    state = saved.setdefault("backend_state", {})
    current = st._backend
    state[id(current)] = (st._bitmask, st._pinned, st._device_gate)
    if on and "worker" not in saved:
        saved["worker"] = inner.out_of_process(st.settings.scheduler.max_num_seqs)
    want = saved["worker"] if on else inner
    st._backend = want
    st._bitmask, st._pinned, st._device_gate = state.get(id(want), (None, False, None))


def _post_only(step: Any, started_wait_s: float = 0.0, before: Any = None) -> None:
    """json_async_devgate_postonly's GrammarStep.start_on_pool: no fill job; the rows are set all open (one torch
    fill on this thread, ~5 us) and go to the device's wait at once."""
    if before is not None:
        before()
    if step._rows is None:
        step.bitmask.fill_(-1)
        step._rows = (step.request_ids, step.positions, step.bitmask)
        if step.seq:
            step.device_gate.open(step.seq)


def _start_on_pool_default() -> Any:
    from octavo.core.grammar_step import GrammarStep

    return GrammarStep.start_on_pool


_START_ON_POOL = _start_on_pool_default()


def _xgm() -> Any:
    import octavo.plugins.structured_output.xgrammar_match as xgm

    return xgm


def _native_module() -> Any:
    import octavo.plugins.structured_output.xgrammar_native as xn

    return xn


def _accept_call() -> Any:
    """xgrammar's native batch accept (a tvm_ffi Function: ``release_gil`` is its own flag, process-wide)."""
    from xgrammar.base import _core

    return _core.BatchGrammarMatcher.batch_accept_token


def baseline(mode: str, on: bool, interval: Any, knobs: dict) -> str:
    """The free mode a constrained mode's overhead is against."""
    base = ("free_async_si" if interval else "free_async") if on else "free"
    if on and knobs.get("depth"):
        base = f"free_async_d{knobs['depth']}"
    if on and knobs.get("old_loop"):
        base = "free_async_old"
    if on and knobs.get("early_launch") is False:
        base = "free_async_noearly"
    if on and "launch_wait" in knobs:
        base = "free_async_wait"
    return base
