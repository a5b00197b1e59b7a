"""One device's forward pass under each inference strategy (batch 1, tensors `[sequence, hidden]`).

- `galaxy` (hybrid model parallelism, §III-B): attention by heads and MLP by columns (tensor
  parallel), the connective blocks (bias of the row-parallel linear, dropout = identity at
  inference, residual add, LayerNorm) by sequence rows (sequence parallel); a ring AllGather enters
  every tensor-parallel block and a ring ReduceScatter leaves it, fused with the block's first and
  last GEMM tile by tile when `overlap` (ring.py). The residual stream stays sequence-partitioned.
- `megatron`: the same tensor-parallel split with an AllReduce after each block and the connective
  blocks replicated on the whole sequence.
- `sp`: whole weights, the device's rows of the sequence; K and V are AllGathered in every
  attention block, everything else is local.
- `local`: `galaxy` on one device (no communication).

Every strategy returns this device's final hidden states and the ring's `Stats`; `gather_output`
assembles the whole `[sequence, hidden]` tensor on every device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from hppctl.runtime.accelerator import Precision
from hppctl.runtime.galaxy.ring import Ring


def embed(shard: dict[str, Any], ids: torch.Tensor) -> torch.Tensor:
    """Token + position (+ BERT's token type 0) embeddings, then BERT/DistilBERT's LayerNorm: `[s, h]`.
    Every device computes them for the whole sequence: the ids are tiny and the lookup is cheap."""
    e, meta = shard["embed"], shard["meta"]
    positions = torch.arange(ids.shape[0], device=ids.device) + e["position_offset"]
    x = e["word"][ids] + e["position"][positions]
    if "token_type" in e:
        x = x + e["token_type"]
    if "ln_w" in e:
        x = F.layer_norm(x, (meta["hidden"],), e["ln_w"], e["ln_b"], meta["eps"])
    return x


def activation(meta: dict[str, Any], x: torch.Tensor) -> torch.Tensor:
    kind = meta["act"]
    if kind == "gelu":
        return F.gelu(x)
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    return F.relu(x)


def layer_norm(meta: dict[str, Any], x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (meta["hidden"],), w, b, meta["eps"])


def attention(meta: dict[str, Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int = 0) -> torch.Tensor:
    """Self-attention of `q` rows (sequence positions q_offset…) over all `k`/`v` rows, head by head:
    `[s_q, a*d]` x `[s_k, a*d]` -> `[s_q, a*d]`; causal for decoder models."""
    d = meta["head_dim"]
    a = q.shape[1] // d
    if a == 0:
        return q
    sq, sk = q.shape[0], k.shape[0]
    qh, kh, vh = (t.reshape(t.shape[0], a, d).transpose(0, 1) for t in (q, k, v))
    mask = None
    if meta["causal"]:
        mask = torch.arange(sk, device=q.device)[None, :] <= (torch.arange(sq, device=q.device)[:, None] + q_offset)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    return out.transpose(0, 1).reshape(sq, a * d)


def split_qkv(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused QKV projection's output as (q, k, v). Public: the inference probe times the same kernels."""
    w = qkv.shape[1] // 3
    return qkv[:, :w], qkv[:, w:2 * w], qkv[:, 2 * w:]


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T + b, the one GEMM every strategy uses (and the inference probe times)."""
    return F.linear(x, w, b)


# --- galaxy (and local) ---------------------------------------------------------------------------

def per_block(overlap: bool | Sequence[bool]) -> tuple[bool, bool, bool, bool]:
    """`overlap` for each of a layer's four ring collectives (attention in/out, MLP in/out): one flag
    for all of them, or the plan's `block_overlap`."""
    if isinstance(overlap, bool):
        return (overlap,) * 4
    flags = tuple(bool(x) for x in overlap)
    if len(flags) != 4:
        raise ValueError(f"overlap: one flag or four (attention in/out, MLP in/out), got {len(flags)}")
    return flags  # type: ignore[return-value]


def galaxy_forward(shard: dict[str, Any], ids: torch.Tensor, ring: Ring, *,
                   overlap: bool | Sequence[bool]) -> torch.Tensor:
    """This device's rows of the final hidden states under hybrid model parallelism; `overlap` per
    collective (per_block), the same in every layer."""
    att_in, att_out, mlp_in, mlp_out = per_block(overlap)
    meta, layers = shard["meta"], shard["layers"]
    mine = ring.rows(ring.rank)
    resid = embed(shard, ids)[mine]  # the residual stream, sequence-partitioned for the whole pass
    block_in = layer_norm(meta, resid, layers[0]["ln1_w"], layers[0]["ln1_b"]) if meta["pre_ln"] and layers else resid
    for n, layer in enumerate(layers):
        # attention: heads of this device over the whole (gathered) sequence
        qkv = ring.allgather_gemm(block_in, lambda t: linear(t, layer["wqkv"], layer["bqkv"]), overlap=att_in)
        heads_out = attention(meta, *split_qkv(qkv))
        partial = ring.gemm_reducescatter(lambda rows: linear(heads_out[rows], layer["wo"]), overlap=att_out)
        resid, block_in = connective(meta, resid, partial + layer["bo"], layer["ln1_w"], layer["ln1_b"],
                                      layer["ln2_w"], layer["ln2_b"])
        # MLP: columns of this device
        hidden = ring.allgather_gemm(block_in, lambda t: activation(meta, linear(t, layer["w1"], layer["b1"])),
                                     overlap=mlp_in)
        partial = ring.gemm_reducescatter(lambda rows: linear(hidden[rows], layer["w2"]), overlap=mlp_out)
        following = layers[n + 1] if n + 1 < len(layers) else None
        nxt = (following["ln1_w"], following["ln1_b"]) if following else shard["final_ln"] or (None, None)
        resid, block_in = connective(meta, resid, partial + layer["b2"], layer["ln2_w"], layer["ln2_b"], *nxt)
    return block_in if meta["pre_ln"] else resid


def connective(meta, resid, block_out, own_w, own_b, next_w, next_b) -> tuple[torch.Tensor, torch.Tensor]:
    """(new residual stream, input of the next block) on this device's rows.

    Post-LN: residual = LN_own(block_out + residual), and it is the next block's input too.
    Pre-LN: residual = residual + block_out; the next block's input is LN_next(residual) (the next
    block's own LayerNorm, or the model's final one after the last layer)."""
    if not meta["pre_ln"]:
        resid = layer_norm(meta, block_out + resid, own_w, own_b)
        return resid, resid
    resid = resid + block_out
    return resid, (layer_norm(meta, resid, next_w, next_b) if next_w is not None else resid)


# --- megatron -------------------------------------------------------------------------------------

def megatron_forward(shard: dict[str, Any], ids: torch.Tensor, ring: Ring) -> torch.Tensor:
    """The whole sequence's final hidden states (every device holds them) under Megatron-LM TP."""
    meta, layers = shard["meta"], shard["layers"]
    resid = embed(shard, ids)
    block_in = layer_norm(meta, resid, layers[0]["ln1_w"], layers[0]["ln1_b"]) if meta["pre_ln"] and layers else resid
    for n, layer in enumerate(layers):
        heads_out = attention(meta, *split_qkv(linear(block_in, layer["wqkv"], layer["bqkv"])))
        out = ring.allreduce(linear(heads_out, layer["wo"]))
        resid, block_in = connective(meta, resid, out + layer["bo"], layer["ln1_w"], layer["ln1_b"],
                                      layer["ln2_w"], layer["ln2_b"])
        hidden = activation(meta, linear(block_in, layer["w1"], layer["b1"]))
        out = ring.allreduce(linear(hidden, layer["w2"]))
        following = layers[n + 1] if n + 1 < len(layers) else None
        nxt = (following["ln1_w"], following["ln1_b"]) if following else shard["final_ln"] or (None, None)
        resid, block_in = connective(meta, resid, out + layer["b2"], layer["ln2_w"], layer["ln2_b"], *nxt)
    return block_in if meta["pre_ln"] else resid


# --- sequence parallelism -------------------------------------------------------------------------

def sp_forward(shard: dict[str, Any], ids: torch.Tensor, ring: Ring) -> torch.Tensor:
    """This device's rows of the final hidden states under sequence parallelism (whole weights)."""
    meta, layers = shard["meta"], shard["layers"]
    mine = ring.rows(ring.rank)
    offset = ring.offsets[ring.rank]
    resid = embed(shard, ids)[mine]
    block_in = layer_norm(meta, resid, layers[0]["ln1_w"], layers[0]["ln1_b"]) if meta["pre_ln"] and layers else resid
    for n, layer in enumerate(layers):
        q, k, v = split_qkv(linear(block_in, layer["wqkv"], layer["bqkv"]))
        keys, values = ring.allgather(k.contiguous()), ring.allgather(v.contiguous())
        out = linear(attention(meta, q, keys, values, q_offset=offset), layer["wo"], layer["bo"])
        resid, block_in = connective(meta, resid, out, layer["ln1_w"], layer["ln1_b"], layer["ln2_w"], layer["ln2_b"])
        out = linear(activation(meta, linear(block_in, layer["w1"], layer["b1"])), layer["w2"], layer["b2"])
        following = layers[n + 1] if n + 1 < len(layers) else None
        nxt = (following["ln1_w"], following["ln1_b"]) if following else shard["final_ln"] or (None, None)
        resid, block_in = connective(meta, resid, out, layer["ln2_w"], layer["ln2_b"], *nxt)
    return block_in if meta["pre_ln"] else resid


def runs_megatron(strategy: str, collective: str) -> bool:
    """Megatron's forward: megatron itself, and galaxy's split on the all-reduce collective."""
    return strategy == "megatron" or (strategy == "galaxy" and collective == "all-reduce")


def forward(strategy: str, shard: dict[str, Any], ids: torch.Tensor, ring: Ring, *, overlap: bool | Sequence[bool],
            precision: Precision | None = None, collective: str = "ring") -> torch.Tensor:
    """This device's output rows (megatron's forward: all rows) for `strategy`, on the device of
    `shard` and `ids`, under `precision`'s autocast (none in fp32). Galaxy with `collective`
    "all-reduce" runs Megatron's forward on galaxy's (any) split of heads and columns."""
    with torch.inference_mode(), (precision or Precision()).autocast():
        if runs_megatron(strategy, collective):
            return megatron_forward(shard, ids, ring)
        if strategy in ("galaxy", "local"):
            return galaxy_forward(shard, ids, ring, overlap=overlap)
        if strategy == "sp":
            return sp_forward(shard, ids, ring)
    raise ValueError(f"unknown strategy {strategy!r}")


def gather_output(strategy: str, out: torch.Tensor, ring: Ring, collective: str = "ring") -> torch.Tensor:
    """The whole `[sequence, hidden]` output: megatron's forward already has it, the others AllGather their rows."""
    if runs_megatron(strategy, collective):
        return out
    with torch.inference_mode():
        return ring.allgather(out.contiguous())
