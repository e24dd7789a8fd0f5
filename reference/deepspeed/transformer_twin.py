"""zerocheck's Transformer (models/transformer.h) as Hugging Face's eager GPT-2 and Llama compute it,
for DeepSpeed to train (twin.py builds it for the transformer presets).

A file of its own so that DeepSpeed's measured memory can tell the model's allocations by their
Python frames: what this code allocates, in the forward or in a checkpoint's recomputation, is an
activation as the engine counts it (memory.py, MODEL_TWIN), unless a DeepSpeed frame inside it
(ZeRO-3's hooks) says otherwise.
"""
import functools
import re

import torch
import torch.utils.checkpoint

from deepspeed.moe.layer import MoE
from deepspeed.runtime.activation_checkpointing import checkpointing as ds_checkpointing


def _rmsnorm(x, w, eps):
    # LlamaRMSNorm.forward (transformers' modeling_llama.py)
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return w * h.to(dtype)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _gelu_new(x):
    # transformers' NewGELUActivation
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


# zerocheck's names of an MoE block's router and experts (Note [MoE routing]).
_MOE_NAME = re.compile(r"router|expert\d+_w_(gate|up|down)")


class _Part(torch.nn.Module):
    """One module of zerocheck's tree, holding its params directly (registered by TransformerTwin
    under zerocheck's names), so that ZeRO-3 gathers them together when its forward runs, as the
    engine's module hooks do."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def norm(self, w, b, x):
        if self.m["norm"] == "layernorm":
            return torch.nn.functional.layer_norm(x, (x.shape[-1],), getattr(self, w), getattr(self, b), self.m["eps"])
        return _rmsnorm(x, getattr(self, w), self.m["eps"])

    def linear(self, w, b, x):
        return torch.nn.functional.linear(x, getattr(self, w), getattr(self, b) if self.m["bias"] else None)


class _Embed(_Part):
    def forward(self, ids, position_ids):
        x = torch.nn.functional.embedding(ids, self.tok)
        if self.m["positions"] == "learned":  # GPT2Model: inputs_embeds + position_embeds
            x = x + torch.nn.functional.embedding(position_ids, self.pos)
        return x


class _Expert(torch.nn.Module):
    """Mixtral's expert MLP as Hugging Face writes it (MixtralBlockSparseTop2MLP): w2(silu(w1 x) * w3 x),
    under zerocheck's names w_gate (w1), w_up (w3), w_down (w2)."""

    def __init__(self, d, f):
        super().__init__()
        self.w_gate = torch.nn.Parameter(torch.zeros(f, d))
        self.w_up = torch.nn.Parameter(torch.zeros(f, d))
        self.w_down = torch.nn.Parameter(torch.zeros(d, f))

    def forward(self, x):
        F = torch.nn.functional
        return F.linear(F.silu(F.linear(x, self.w_gate)) * F.linear(x, self.w_up), self.w_down)


class _Block(_Part):
    """GPT2Block or LlamaDecoderLayer, eager attention, dropout 0; with experts, the MLP is
    DeepSpeed's own MoE layer (deepspeed.moe.layer.MoE: TopKGate and MOELayer's dispatch and
    combine, sharded_moe.py) over Mixtral's experts, gated as zerocheck gates (Note [MoE routing] in
    models/transformer.h): top-2 without the Gumbel noise on the second choice
    (top2_2nd_expert_sampling=False), drop_tokens, and the load-balancing loss left unused."""

    def __init__(self, m):
        super().__init__(m)
        if m.get("experts", 0):
            self.moe = MoE(m["dim"], _Expert(m["dim"], m["ffn"]), num_experts=m["experts"], ep_size=m["ep_size"],
                           k=m["top_k"], capacity_factor=m["capacity_factor"], min_capacity=m["min_capacity"],
                           top2_2nd_expert_sampling=False)

    def forward(self, x, mask, rope, position_ids=None):
        # position_ids: what Hugging Face passes a decoder layer beside the hidden states; the
        # layer reads none of it here (rope carries Llama's positions), but a checkpoint holds it.
        if self.m["norm"] == "layernorm":  # GPT2Block keeps its attention output until it returns
            residual = x
            a = self.attention(self.norm("attn_norm", "attn_norm_b", x), mask, rope)
            x = a + residual
            residual = x
            f = self.mlp(self.norm("mlp_norm", "mlp_norm_b", x))
            return residual + f
        residual = x
        x = self.attention(self.norm("attn_norm", None, x), mask, rope)
        x = residual + x
        residual = x
        x = self.mlp(self.norm("mlp_norm", None, x))
        return residual + x

    def attention(self, h, mask, rope):
        m = self.m
        B, S, _ = h.shape
        H, Hkv = m["heads"], m["kv_heads"]
        dh = m["dim"] // H
        q = self.linear("wq", "bq", h).view(B, S, H, dh).transpose(1, 2)
        k = self.linear("wk", "bk", h).view(B, S, Hkv, dh).transpose(1, 2)
        v = self.linear("wv", "bv", h).view(B, S, Hkv, dh).transpose(1, 2)
        if m["norm"] == "layernorm":  # GPT2Attention's eager_attention_forward
            w = torch.matmul(q, k.transpose(-1, -2))
            w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
            w = w + mask
            w = torch.nn.functional.softmax(w, dim=-1)
            w = w.type(v.dtype)
        else:  # LlamaAttention: rotary positions, repeat_kv, softmax in f32
            cos, sin = rope
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            if H != Hkv:
                rep = H // Hkv
                k = k[:, :, None, :, :].expand(B, Hkv, rep, S, dh).reshape(B, H, S, dh)
                v = v[:, :, None, :, :].expand(B, Hkv, rep, S, dh).reshape(B, H, S, dh)
            w = torch.matmul(q, k.transpose(2, 3)) * dh ** -0.5
            w = w + mask
            w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(w, v)
        o = o.transpose(1, 2).contiguous()
        o = o.reshape(B, S, -1).contiguous()
        return self.linear("wo", "bo", o)

    def mlp(self, h):
        if self.m.get("experts", 0):
            out, _l_aux, _counts = self.moe(h)
            return out
        if self.m["mlp"] == "gelu":
            return self.linear("w_proj", "b_proj", _gelu_new(self.linear("w_fc", "b_fc", h)))
        gate = torch.nn.functional.linear(h, self.w_gate)
        up = torch.nn.functional.linear(h, self.w_up)
        return torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, self.w_down)


class _Norm(_Part):
    def forward(self, x):
        return self.norm("weight", "bias", x)


class _Head(_Part):
    def forward(self, h):
        return torch.nn.functional.linear(h, self.weight)


class TransformerTwin(torch.nn.Module):
    """zerocheck's Transformer (models/transformer.h) as Hugging Face's eager GPT2LMHeadModel and
    LlamaForCausalLM compute it: the same ops in the same order, so autograd saves what it saves
    there (Note [Hugging Face's saved tensors]); dropout 0. The tree is zerocheck's: embed, layers.i,
    norm, lm_head, each holding its params directly (wq, wk, ...), so ZeRO-3 gathers a decoder layer
    at once, as the engine does, where Hugging Face's Linear submodules are gathered one by one."""

    def __init__(self, m, params):
        super().__init__()
        self.m = m
        self.embed = _Embed(m)
        self.layers = torch.nn.ModuleList(_Block(m) for _ in range(m["layers"]))
        self.norm = _Norm(m)
        self.lm_head = _Head(m)
        for p in params:
            owner, name = p["name"].rsplit(".", 1)
            if _MOE_NAME.fullmatch(name):  # DeepSpeed's MoE layer holds its own (zc_named_parameters)
                continue
            self.get_submodule(owner).register_parameter(name, torch.nn.Parameter(torch.zeros(p["shape"])))
        if m["tied_embeddings"]:  # Hugging Face ties lm_head.weight to the token embedding
            self.lm_head.weight = self.embed.tok

    def zc_named_parameters(self, ep_rank):
        """(zerocheck's name, param) in named_parameters() order. DeepSpeed's MoE layer names its
        router moe.deepspeed_moe.gate.wg.weight and this rank's experts
        moe.deepspeed_moe.experts.deepspeed_experts.<j>.<w>; zerocheck names them router and
        expert<e>_<w> by global id e = ep_rank * local experts + j (Note [MoE routing])."""
        local = self.m.get("experts", 0) // self.m.get("ep_size", 1)
        out = []
        for name, p in self.named_parameters():
            r = re.fullmatch(r"(layers\.\d+)\.moe\.deepspeed_moe\.gate\.wg\.weight", name)
            e = re.fullmatch(r"(layers\.\d+)\.moe\.deepspeed_moe\.experts\.deepspeed_experts\.(\d+)\.(\w+)", name)
            if r:
                name = f"{r.group(1)}.router"
            elif e:
                name = f"{e.group(1)}.expert{ep_rank * local + int(e.group(2))}_{e.group(3)}"
            out.append((name, p))
        return out

    def forward(self, ids, labels):
        m = self.m
        B, S = ids.shape
        position_ids = torch.arange(S).unsqueeze(0)  # int64 [1, S], as Hugging Face's models make them
        x = self.embed(ids, position_ids)
        dtype = x.dtype
        rope = None
        if m["positions"] == "rotary":  # LlamaRotaryEmbedding: cos and sin [1, S, dh] in the model dtype
            dh = m["dim"] // m["heads"]
            inv_freq = 1.0 / (m["rope_base"] ** (torch.arange(0, dh, 2, dtype=torch.int64).float() / dh))
            freqs = (inv_freq[None, :, None].float() @ position_ids[:, None, :].float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            rope = (emb.cos().to(dtype), emb.sin().to(dtype))
            del inv_freq, freqs, emb
        # The eager causal mask [B, 1, S, S] in the model dtype: 0 where a query sees a key, the
        # dtype's lowest value above the diagonal.
        mask = torch.full((S, S), torch.finfo(dtype).min, dtype=dtype).triu(1)[None, None].expand(B, 1, S, S).contiguous()
        for layer in self.layers:
            x = self._layer(layer, x, mask, rope, position_ids)
        del mask, position_ids
        logits = self.lm_head(self.norm(x))
        del x
        # ForCausalLMLoss: the logits upcast, the labels padded and shifted into a contiguous
        # target (zerocheck's labels are already the next tokens, so the pad goes in front); its
        # local holds the padded labels until it returns, through cross_entropy.
        logits = logits.float().view(-1, m["vocab"])
        padded = torch.nn.functional.pad(labels, (1, 0), value=-100)
        target = padded[..., 1:].contiguous().view(-1)
        return torch.nn.functional.cross_entropy(logits, target, ignore_index=-100, reduction="mean")


    def _layer(self, layer, x, mask, rope, position_ids):
        """One decoder layer, under the scenario's activation checkpointing (Note [Gradient
        checkpointing] in models/transformer.h). The layer runs as a module either way, so
        DeepSpeed's ZeRO-3 hooks fire in the forward and again in the recomputation."""
        how = self.m.get("checkpointing", "")
        if not how:
            return layer(x, mask, rope)
        if how == "torch":
            # Hugging Face's GradientCheckpointingLayer (gradient_checkpointing_enable(), reentrant as
            # transformers 4.x passes it): the hidden states and what the model passes positionally
            # (GPT-2's mask) are the checkpoint's saved inputs; what it passes by keyword (Llama's
            # mask, position ids, cos and sin; GPT-2's position ids) stays in the partial, the
            # checkpoint's run_function, as long as the loss graph.
            if self.m["positions"] == "learned":
                fn = functools.partial(layer, rope=rope, position_ids=position_ids)
                return torch.utils.checkpoint.checkpoint(fn, x, mask, use_reentrant=True)
            fn = functools.partial(layer, mask=mask, rope=rope, position_ids=position_ids)
            return torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=True)
        # deepspeed.checkpointing.checkpoint(function, *args), every argument positional (as
        # Megatron-style models call it), configured by configure_checkpointing(). Under
        # partition_activations DeepSpeed replaces every floating-point argument's .data with an
        # empty tensor once the layer's forward has run (checkpointing.py:455,
        # get_partitioned_activations_for_backward): the mask and cos/sin that every layer shares
        # would reach the next layer empty ("IndexError: Dimension out of range"). A model shares
        # them by marking them no_checkpointing (checkpointing.py:382), as here; the hidden states
        # are partitioned.
        for t in (mask,) + (rope or ()):
            t.no_checkpointing = True
        if rope is None:
            return ds_checkpointing.checkpoint(lambda h, mk: layer(h, mk, None), x, mask)
        return ds_checkpointing.checkpoint(lambda h, mk, cos, sin, pid: layer(h, mk, (cos, sin), pid),
                                                  x, mask, rope[0], rope[1], position_ids)
