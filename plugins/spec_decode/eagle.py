"""The ``eagle`` and ``eagle3`` proposers: EAGLE heads (Li et al. 2024/2025) — one Llama decoder layer that
reads the target's hidden states and attends over the sequence, so unlike Medusa it keeps state per request.

At position ``p`` the head's input is the embedding of token ``p+1`` and the target's feature at ``p``::

    EAGLE-1 : x_p = fc([embed(t_{p+1}); h_p])            h = the target's final (normed) hidden state
              out_p = layer(x_p)  (no input norm)        logits = the target's lm_head(out_p)
    EAGLE-3 : x_p = [input_ln(embed(t_{p+1})); hidden_norm(g_p)],  g_p = fc([a_p^(l1); a_p^(l2); a_p^(l3)])
              (a^(l): the target's residual stream entering layers l = 2, N/2, N-3, or the config's ids)
              out_p = layer(x_p), logits = lm_head(norm(out_p)) over a draft vocabulary mapped by d2t

Each step the head first catches up on the positions the target verified (its own K/V per request, in a
dense buffer indexed by position: rejected drafts are simply overwritten later), then drafts: draft 1 from
the output at the last verified position, draft j+1 by feeding draft j with the head's own output as the
feature. Checkpoint layouts (``config.json`` + ``*.safetensors`` / ``pytorch_model.bin``):

- EAGLE-1 (SafeAILab / vLLM ``EagleLlamaForCausalLM``): ``fc.weight`` [H, 2H] (``fc.bias`` optional),
  ``layers.0.self_attn.{q,k,v,o}_proj.weight``, ``layers.0.post_attention_layernorm.weight``,
  ``layers.0.mlp.{gate,up,down}_proj.weight``; ``embed_tokens.weight`` optional (else the target's).
- EAGLE-3 (``LlamaForCausalLMEagle3``): ``midlayer.*`` (the layer, q/k/v over 2H inputs, plus
  ``input_layernorm`` and ``hidden_norm``), ``fc.weight`` [H, 3H_target], ``norm.weight``, ``lm_head.weight``
  [draft_vocab, H], ``d2t`` (draft id -> target id offset), ``t2d`` (ignored, as vLLM does).
Only single-layer heads (the published ones) are built; more layers are refused at start.
"""

from __future__ import annotations

from octavo.spec_heads import (
    HeadSpeculator,
    check_dense_head,
    checkpoint_dir,
    load_exact,
    read_config,
    read_state_dict,
)


class EagleSpeculator(HeadSpeculator):
    name = "eagle"
    version = 1
    stateful = True  # fed every step (prefill chunks too), not only when drafting

    @classmethod
    def check(cls, config, settings, platform, vocab_size: int) -> None:
        cfg = read_config(checkpoint_dir(config.model))
        if cfg.get("num_hidden_layers", 1) != 1:
            raise ValueError(f"{cls.name} head {config.model!r} has num_hidden_layers={cfg['num_hidden_layers']}; "
                             "only single-layer EAGLE heads (the published layout) are supported")
        if cfg.get("add_para_norm"):
            raise ValueError(f"{cls.name} head {config.model!r}: the HASS variant (add_para_norm) is not supported")
        check_dense_head(config, cfg.get("vocab_size", vocab_size), vocab_size, f"{cls.name} head {config.model!r}",
                         "EAGLE heads")

    @classmethod
    def load_head(cls, config, *, hidden_size: int, vocab_size: int, device, dtype, target=None,
                  max_num_tokens: int = 8192):
        from octavo.plugins.spec_decode.eagle_head import EagleHead

        path = checkpoint_dir(config.model)
        cfg = read_config(path)
        state = read_state_dict(path)
        if target is None:
            raise ValueError(f"{cls.name} shares the target's embedding and layers; it needs the loaded target")
        head = EagleHead(cfg, cls.version, target, hidden_size, vocab_size, state, config.num_speculative_tokens,
                         max_num_tokens)
        load_exact(head.trainable(), head.rename(state), f"{cls.name} ({config.model})")
        return head.to(device=device, dtype=dtype).eval().ready()


class Eagle3Speculator(EagleSpeculator):
    name = "eagle3"
    version = 3
