"""One decode step ([batch, 1]) of a Llama-shaped int4 model, without transformers' modules.

At one stream the weights are read in a few milliseconds; the rest of a step was Python and
dispatch: 30 layers of module calls, hooks, output records and seven Int4Linear calls each.
This forward does the same arithmetic with plain torch calls and the fused 4-bit matmuls of
inference/quant.py (q/k/v in one, gate/up in one), so a step makes 5 kernel calls per layer.

Nothing may change an answer: every operation is the one transformers' LlamaModel applies, in
the same order and dtype (rotary in bfloat16, the same attention and norm functions, which it
installs in the model: inference/prefill_attention.py, inference/rmsnorm.py), so the logits
are bit for bit the same (tests/inference/test_decode_step.py). Above
quant.FEW_ROWS rows the projections are the modules' own calls (their bfloat16 weights), as in
transformers' forward. It serves only what it was written for: a Llama model whose projections
are all 4-bit (DTYPE=int4); any other model goes through its own forward.

The batch's KV comes in groups of rows (inference/batch.py): every row goes through the weights
together, and attention runs per group over that group's padded KV and mask.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from inference import attention, prefill_attention, quant
from inference.rmsnorm import install as install_norms
from inference.rmsnorm import is_llama_norm, rms_norm
from inference.rotary import rotate


def _kernel_args(linear: quant.Int4Linear | quant.FusedInt4) -> tuple:
    """What the 4-bit kernel reads of a layer: its buffers, read once (each read through the
    module's __getattr__ was ~380 lookups per step)."""
    return linear.packed, linear.group, linear.scales_zeros, linear.blocks, linear.bias


class _Layer:
    """What one decoder layer's step reads, fetched once instead of through module lookups."""

    def __init__(self, layer: Any) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.attn = attn
        self.qkv, self.o = _kernel_args(attn.qkv_int4), _kernel_args(attn.o_proj)
        self.gate_up, self.down = _kernel_args(mlp.gate_up_int4), _kernel_args(mlp.down_proj)
        self.gate_up_sizes = mlp.gate_up_int4.sizes
        # many rows: the parts' own forward (their bfloat16 weights), as transformers calls them
        self.qkv_parts = (attn.q_proj, attn.k_proj, attn.v_proj)
        self.o_proj, self.down_proj = attn.o_proj, mlp.down_proj
        self.gate_up_parts = (mlp.gate_proj, mlp.up_proj)
        self.norm_in, self.eps_in = (
            layer.input_layernorm.weight,
            layer.input_layernorm.variance_epsilon,
        )
        self.norm_post, self.eps_post = (
            layer.post_attention_layernorm.weight,
            layer.post_attention_layernorm.variance_epsilon,
        )
        self.index = attn.layer_idx
        self.scaling = attn.scaling


def supports(model: Any) -> bool:
    """A Llama model quantized to int4 with its projections fused, under sdpa attention, with
    transformers' own norms (which the step swaps for its own: inference/rmsnorm.py)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "llama" or config.hidden_act != "silu":
        return False
    if getattr(config, "_attn_implementation", None) != "sdpa" or config.attention_bias:
        return False
    if not isinstance(getattr(model, "lm_head", None), quant.Int8Linear):
        return False
    if not is_llama_norm(model.model.norm):
        return False
    return all(
        isinstance(getattr(layer.self_attn, "qkv_int4", None), quant.FusedInt4)
        and isinstance(getattr(layer.mlp, "gate_up_int4", None), quant.FusedInt4)
        and isinstance(layer.self_attn.o_proj, quant.Int4Linear)
        and isinstance(layer.mlp.down_proj, quant.Int4Linear)
        and is_llama_norm(layer.input_layernorm)
        and is_llama_norm(layer.post_attention_layernorm)
        for layer in model.model.layers
    )


class DecodeStep:
    """`step(...)` is `model(input_ids, attention_mask, position_ids, past_key_values).logits`
    for a [batch, 1] decode step, bit for bit."""

    def __init__(self, model: Any) -> None:
        from transformers.masking_utils import create_causal_mask

        self.model = model
        self.config = model.config
        inner = model.model
        self.embed, self.rotary, self.norm = inner.embed_tokens, inner.rotary_emb, inner.norm
        self.layers = [_Layer(layer) for layer in inner.layers[: self.config.num_hidden_layers]]
        self.heads = self.config.num_attention_heads
        self.kv_heads = self.config.num_key_value_heads
        self.head_dim = self.layers[0].attn.head_dim
        self._mask = create_causal_mask
        prefill_attention.register()  # so the model's own forward attends as this step does
        install_norms(model)  # and normalizes as it does
        # what transformers' forward calls (its sdpa slot)
        self._attend = prefill_attention.attention

    def handles(self, batch: int) -> bool:
        """Outside dense_only() (a prefill), any batch."""
        return not quant.dense_forced()

    def step(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        groups: list[tuple[Any, Any]],
        head_threads: int = 0,
    ) -> torch.Tensor:
        """input_ids and position_ids [B, 1]; `groups`: (attention_mask [b, T], cache) of the
        rows in order, b summing to B -> logits [B, 1, vocab]. `head_threads`: torch threads
        for the LM head alone (0: as they are): a step of one stream runs its ~150 small
        kernels on one thread, but the head is one call over 28 MB of int8 weights, where a
        second thread pays for its one barrier (3.1 -> 1.7-2.0 ms, same bits)."""
        h = self.embed(input_ids)
        spans, start = [], 0
        for mask, cache in groups:
            end = start + mask.shape[0]
            rows = slice(start, end)
            spans.append((rows, self._group_mask(h[rows], mask, cache, position_ids[rows]), cache))
            start = end
        cos, sin = self.rotary(h, position_ids=position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        few = h.shape[0] <= quant.FEW_ROWS
        # what prefill_attention.attention would pick for one query per row, picked once for
        # the step's 30 calls instead of in each
        direct = h.device.type == "cpu" and attention.pays()
        for layer in self.layers:
            h = self._layer(layer, h, spans, cos, sin, few, direct)
        h = rms_norm(h, self.norm.weight, self.norm.variance_epsilon)
        if head_threads:
            torch.set_num_threads(head_threads)
        return self.model.lm_head(h)

    def _group_mask(
        self, h: torch.Tensor, mask: torch.Tensor, cache: Any, position_ids: torch.Tensor
    ) -> torch.Tensor | None:
        return self._mask(
            config=self.config,
            inputs_embeds=h,
            attention_mask=mask,
            past_key_values=cache,
            position_ids=position_ids,
        )

    def _layer(
        self,
        layer: _Layer,
        h: torch.Tensor,
        spans: list[tuple[slice, torch.Tensor | None, Any]],
        cos: torch.Tensor,
        sin: torch.Tensor,
        few: bool,
        direct: bool,
    ) -> torch.Tensor:
        b, d, heads, kv_heads = h.shape[0], self.head_dim, self.heads, self.kv_heads
        x = rms_norm(h, layer.norm_in, layer.eps_in).reshape(b, -1)
        if few:
            # q and k side by side in the fused output: rotated in one pass (the same
            # elementwise arithmetic on each element, half the calls)
            qkv = _int4(layer.qkv, x).view(b, 1, heads + 2 * kv_heads, d).transpose(1, 2)
            qk = rotate(qkv[:, : heads + kv_heads], cos, sin)
            q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]
        else:
            q, k, v = (proj(x) for proj in layer.qkv_parts)
            q = rotate(q.view(b, 1, heads, d).transpose(1, 2), cos, sin)
            k = rotate(k.view(b, 1, kv_heads, d).transpose(1, 2), cos, sin)
            v = v.view(b, 1, kv_heads, d).transpose(1, 2)
        outs = []
        for rows, mask, cache in spans:
            keys, values = cache.layers[layer.index].update(k[rows], v[rows])
            if direct:
                out = attention.one_query(q[rows], keys, values, mask, layer.scaling)
            else:
                out, _ = self._attend(
                    layer.attn, q[rows], keys, values, mask, dropout=0.0, scaling=layer.scaling
                )
            outs.append(out)
        out = (outs[0] if len(outs) == 1 else torch.cat(outs)).reshape(b, -1)
        h = h + (_int4(layer.o, out) if few else layer.o_proj(out)).view(b, 1, -1)
        x = rms_norm(h, layer.norm_post, layer.eps_post).reshape(b, -1)
        if few:
            gate, up = _int4(layer.gate_up, x).split(layer.gate_up_sizes, dim=-1)
            down = _int4(layer.down, F.silu(gate) * up)
        else:
            gate, up = (proj(x) for proj in layer.gate_up_parts)
            down = layer.down_proj(F.silu(gate) * up)
        return h + down.view(b, 1, -1)


def _int4(args: tuple, flat: torch.Tensor) -> torch.Tensor:
    """The 4-bit kernel on flat [rows, in] bfloat16, without a module call: Int4Linear's
    few-rows path, or FusedInt4's forward. `args`: _kernel_args of the layer."""
    packed, group, scales_zeros, blocks, bias = args
    y = quant.int4_mm(flat, packed, group, scales_zeros, blocks)
    return y if bias is None else y + bias
