"""A transformer's weights in one uniform layout, and each device's slice of them.

Every supported family (BERT, DistilBERT, GPT-2, OPT) is read into `ModelWeights`: per layer the
query/key/value/output projections, the two MLP linears and the two LayerNorms, all as `nn.Linear`
weights `[out, in]` (GPT-2's `Conv1D` `[in, out]` is transposed), plus what the embeddings and the
final LayerNorm need. `device_shard` cuts out a device's heads and MLP columns; workers only ever
see their shard, so they import torch but never `transformers`.

Naming, whatever the family: `ln1` is the LayerNorm of the attention block's connective part and
`ln2` the MLP's. Post-LN (BERT, DistilBERT) applies them after the residual add; pre-LN (GPT-2, OPT)
before the block, with the model's final LayerNorm after the last layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from hppctl.errors import BadInput

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
LAYER_COUNT_KEYS = {"bert": "num_hidden_layers", "distilbert": "n_layers", "gpt2": "n_layer", "opt": "num_hidden_layers"}


def _t(w: torch.Tensor) -> torch.Tensor:
    return w.detach().clone().contiguous()


def base_model(module: Any) -> Any:
    """The headless model inside a zoo module or a Hugging Face model with a head."""
    hf = getattr(module, "model", module)
    prefix = getattr(hf, "base_model_prefix", "")
    return getattr(hf, prefix, hf) if prefix and hasattr(hf, prefix) else hf


def build_base_model(model: str, num_layers: int | None = None, *, seed: int = 0) -> tuple[Any, str]:
    """(headless HF model in eval mode, family) for a zoo name or `hf:PATH`. Built-in models get
    random weights from `seed` and, when `num_layers` is given, only that many layers (a layer stack)."""
    from hppctl.zoo import get_model

    spec = get_model(model)
    if spec.family not in LAYER_COUNT_KEYS:
        raise BadInput(f"{model}: collaborative inference supports bert, distilbert, gpt2 and opt models, "
                       f"not {spec.family}")
    if num_layers is not None and spec.hf_path is None:
        spec = dataclasses.replace(spec, config={**spec.config, LAYER_COUNT_KEYS[spec.family]: num_layers})
    module = spec.build(weights=spec.hf_path is not None, seed=seed)
    module.eval()
    return base_model(module), spec.family


def extract(base: Any, family: str, num_layers: int | None = None) -> dict[str, Any]:
    """The uniform layout of `base`'s first `num_layers` layers (all by default)."""
    reader = {"bert": _bert, "distilbert": _distilbert, "gpt2": _gpt2, "opt": _opt}[family]
    weights = reader(base)
    if num_layers is not None:
        if num_layers > len(weights["layers"]):
            raise BadInput(f"the model has {len(weights['layers'])} layers, the plan runs {num_layers}")
        weights["layers"] = weights["layers"][:num_layers]
    return weights


def _activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise BadInput(f"activation {name!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def _layer(q, k, v, o, fc1, fc2, ln1, ln2) -> dict[str, torch.Tensor]:
    return {"wq": _t(q.weight), "bq": _t(q.bias), "wk": _t(k.weight), "bk": _t(k.bias), "wv": _t(v.weight),
            "bv": _t(v.bias), "wo": _t(o.weight), "bo": _t(o.bias), "w1": _t(fc1.weight), "b1": _t(fc1.bias),
            "w2": _t(fc2.weight), "b2": _t(fc2.bias), "ln1_w": _t(ln1.weight), "ln1_b": _t(ln1.bias),
            "ln2_w": _t(ln2.weight), "ln2_b": _t(ln2.bias)}


def _meta(config, *, family, pre_ln, causal, act, heads, eps) -> dict[str, Any]:
    hidden = config.hidden_size
    return {"family": family, "pre_ln": pre_ln, "causal": causal, "act": _activation(act), "heads": heads,
            "hidden": hidden, "head_dim": hidden // heads, "eps": float(eps)}


def _bert(m) -> dict[str, Any]:
    c, e = m.config, m.embeddings
    layers = [_layer(l.attention.self.query, l.attention.self.key, l.attention.self.value, l.attention.output.dense,
                     l.intermediate.dense, l.output.dense, l.attention.output.LayerNorm, l.output.LayerNorm)
              for l in m.encoder.layer]
    return {"meta": _meta(c, family="bert", pre_ln=False, causal=False, act=c.hidden_act, heads=c.num_attention_heads,
                          eps=c.layer_norm_eps),
            "embed": {"word": _t(e.word_embeddings.weight), "position": _t(e.position_embeddings.weight),
                      "token_type": _t(e.token_type_embeddings.weight[0]), "ln_w": _t(e.LayerNorm.weight),
                      "ln_b": _t(e.LayerNorm.bias), "position_offset": 0},
            "layers": layers, "final_ln": None}


def _distilbert(m) -> dict[str, Any]:
    c, e = m.config, m.embeddings
    layers = [_layer(l.attention.q_lin, l.attention.k_lin, l.attention.v_lin, l.attention.out_lin, l.ffn.lin1,
                     l.ffn.lin2, l.sa_layer_norm, l.output_layer_norm) for l in m.transformer.layer]
    return {"meta": _meta(c, family="distilbert", pre_ln=False, causal=False, act=c.activation, heads=c.n_heads,
                          eps=e.LayerNorm.eps),
            "embed": {"word": _t(e.word_embeddings.weight), "position": _t(e.position_embeddings.weight),
                      "ln_w": _t(e.LayerNorm.weight), "ln_b": _t(e.LayerNorm.bias), "position_offset": 0},
            "layers": layers, "final_ln": None}


class _Linear:
    """A GPT-2 `Conv1D` slice seen as an `nn.Linear` (weight [out, in])."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        self.weight, self.bias = weight.t(), bias


def _gpt2(m) -> dict[str, Any]:
    c = m.config
    if getattr(c, "scale_attn_by_inverse_layer_idx", False) or not getattr(c, "scale_attn_weights", True):
        raise BadInput("gpt2: only the standard attention scaling (1/sqrt(head_dim)) is supported")
    h = c.hidden_size
    layers = []
    for l in m.h:
        w, b = l.attn.c_attn.weight, l.attn.c_attn.bias  # [h, 3h]: columns q | k | v
        q, k, v = (_Linear(w[:, i * h:(i + 1) * h], b[i * h:(i + 1) * h]) for i in range(3))
        o = _Linear(l.attn.c_proj.weight, l.attn.c_proj.bias)
        fc1, fc2 = _Linear(l.mlp.c_fc.weight, l.mlp.c_fc.bias), _Linear(l.mlp.c_proj.weight, l.mlp.c_proj.bias)
        layers.append(_layer(q, k, v, o, fc1, fc2, l.ln_1, l.ln_2))
    return {"meta": _meta(c, family="gpt2", pre_ln=True, causal=True, act=c.activation_function,
                          heads=c.num_attention_heads, eps=c.layer_norm_epsilon),
            "embed": {"word": _t(m.wte.weight), "position": _t(m.wpe.weight), "position_offset": 0},
            "layers": layers, "final_ln": (_t(m.ln_f.weight), _t(m.ln_f.bias))}


def _opt(m) -> dict[str, Any]:
    d = getattr(m, "decoder", m)
    c = m.config
    if d.project_in is not None or d.project_out is not None:
        raise BadInput("opt: word_embed_proj_dim different from hidden_size is not supported")
    if not getattr(c, "enable_bias", True) or not getattr(c, "layer_norm_elementwise_affine", True):
        raise BadInput("opt: models without biases or LayerNorm affine parameters are not supported")
    layers = [_layer(l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj, l.self_attn.out_proj, l.fc1, l.fc2,
                     l.self_attn_layer_norm, l.final_layer_norm) for l in d.layers]
    final = d.final_layer_norm
    return {"meta": _meta(c, family="opt", pre_ln=bool(c.do_layer_norm_before), causal=True,
                          act=c.activation_function, heads=c.num_attention_heads, eps=d.layers[0].final_layer_norm.eps
                          if len(d.layers) else 1e-5),
            "embed": {"word": _t(d.embed_tokens.weight), "position": _t(d.embed_positions.weight),
                      "position_offset": int(getattr(d.embed_positions, "offset", 2))},
            "layers": layers, "final_ln": (_t(final.weight), _t(final.bias)) if final is not None else None}


def slice_layer(layer: dict[str, torch.Tensor], head_dim: int, heads: tuple[int, int],
                columns: tuple[int, int]) -> dict[str, torch.Tensor]:
    """A device's part of one layer: heads [h0, h1) (QKV column-parallel, output projection
    row-parallel) and MLP columns [c0, c1) (first linear column-parallel, second row-parallel).
    Q, K and V are stacked in one `wqkv` so that the first GEMM of the block is one GEMM.
    The row-parallel biases `bo` and `b2` stay whole: they are added once, after the reduction."""
    r0, r1 = heads[0] * head_dim, heads[1] * head_dim
    c0, c1 = columns
    return {
        "wqkv": torch.cat([layer["wq"][r0:r1], layer["wk"][r0:r1], layer["wv"][r0:r1]]).contiguous(),
        "bqkv": torch.cat([layer["bq"][r0:r1], layer["bk"][r0:r1], layer["bv"][r0:r1]]).contiguous(),
        "wo": layer["wo"][:, r0:r1].contiguous(), "bo": layer["bo"],
        "w1": layer["w1"][c0:c1].contiguous(), "b1": layer["b1"][c0:c1].contiguous(),
        "w2": layer["w2"][:, c0:c1].contiguous(), "b2": layer["b2"],
        **{k: layer[k] for k in ("ln1_w", "ln1_b", "ln2_w", "ln2_b")},
    }


def device_shard(weights: dict[str, Any], heads: tuple[int, int], columns: tuple[int, int]) -> dict[str, Any]:
    """What one device holds: its slice of every layer, the embeddings and the final LayerNorm."""
    head_dim = weights["meta"]["head_dim"]
    return {"meta": {**weights["meta"], "local_heads": heads[1] - heads[0]},
            "embed": weights["embed"], "final_ln": weights["final_ln"],
            "layers": [slice_layer(layer, head_dim, heads, columns) for layer in weights["layers"]]}


def shard_bytes(shard: dict[str, Any]) -> int:
    """Bytes of a shard's layer weights (what Eq. 5 counts: attention and MLP, biases included)."""
    keys = ("wqkv", "bqkv", "wo", "bo", "w1", "b1", "w2", "b2")
    return sum(layer[k].numel() * layer[k].element_size() for layer in shard["layers"] for k in keys)


def for_request(shard: dict[str, Any], ids: torch.Tensor) -> tuple[dict[str, Any], torch.Tensor]:
    """(the shard with only the embedding rows the request reads, ids into those rows).

    A request's ids are known before the weights ship, so a device receives the rows of the token
    table its ids select (in order) and the positions it uses, instead of the whole tables (GPT2-L's
    token table alone is 257 MB in fp32, which would cross a 125 Mbit/s link on every run). The
    embedding it computes is the same; the plan still counts the whole tables (a deployed device
    holds them)."""
    e = shard["embed"]
    trimmed = {**e, "word": e["word"][ids].contiguous(),
               "position": e["position"][:e["position_offset"] + ids.numel()].contiguous()}
    return {**shard, "embed": trimmed}, torch.arange(ids.numel())
