"""Small Hugging Face models of each family (random weights from a seed, eager attention, eval mode)."""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

CONFIGS = {
    "bert": ("BertConfig", "BertModel", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                             intermediate_size=128, vocab_size=100, max_position_embeddings=64)),
    "distilbert": ("DistilBertConfig", "DistilBertModel", dict(dim=32, n_layers=2, n_heads=4, hidden_dim=128,
                                                               vocab_size=100, max_position_embeddings=64)),
    "gpt2": ("GPT2Config", "GPT2Model", dict(n_embd=32, n_layer=2, n_head=4, n_inner=128, vocab_size=100,
                                             n_positions=64, bos_token_id=0, eos_token_id=0)),
    "opt": ("OPTConfig", "OPTModel", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                                          word_embed_proj_dim=32, vocab_size=100, max_position_embeddings=64,
                                          bos_token_id=0, eos_token_id=0, pad_token_id=1)),
}


def hf_model(family: str, seed: int = 0):
    import transformers

    config_name, model_name, kw = CONFIGS[family]
    config = getattr(transformers, config_name)(**kw)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(transformers, model_name)(config)
    # Random LayerNorm parameters and biases too, so that a bias added twice or a LayerNorm skipped shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(0.5 if name.endswith("weight") else 0.0, 0.2)
    return model.eval()


def make_inference_profile(speeds=(3.0, 2.0, 1.0), budgets_mb=(1000, 1000, 1000), *, heads: int = 12,
                           hidden: int = 48, intermediate: int = 192, layers: int = 4, seq_lens=(64,),
                           family: str = "gpt2", model: str = "gpt2-test", bandwidth: float = 125e6 / 8,
                           names=None, cpu_cores=None, threads=None, comm_cpu=None, allreduce_cpu=None):
    """An inference profile whose block times are exactly proportional to work / speed:
    attention 1 ms per head, MLP 1 ms per 16 columns, connective 0.01 ms per row (at speed 1, at the
    first sequence length; linear in the length). cpu_cores, threads, comm_cpu (ring CPU s/byte) and
    allreduce_cpu: the same on every device (None: not measured)."""
    from hppctl.models.inference import BlockGrid, InferenceDevice, InferenceProfile, SeqLenTimings

    names = names or [f"d{i}" for i in range(len(speeds))]
    devices = []
    for name, speed, budget in zip(names, speeds, budgets_mb):
        timings = []
        for s in seq_lens:
            scale = s / seq_lens[0] / speed
            head_sizes, col_sizes, row_sizes = list(range(1, heads + 1)), [intermediate // 4 * k for k in (1, 2, 3, 4)], [s // 2, s]
            timings.append(SeqLenTimings(
                seq_len=s,
                attention=BlockGrid(sizes=head_sizes, seconds=[1e-3 * a * scale for a in head_sizes]),
                mlp=BlockGrid(sizes=col_sizes, seconds=[1e-3 * c / 16 * scale for c in col_sizes]),
                connective=BlockGrid(sizes=row_sizes, seconds=[1e-5 * r / speed for r in row_sizes])))
        devices.append(InferenceDevice(name=name, kind="synthetic", source="preset", memory_bytes=int(budget * 1e6),
                                       timings=timings, cpu_cores=cpu_cores, threads=threads,
                                       comm_cpu_s_per_byte=comm_cpu, allreduce_cpu_s_per_byte=allreduce_cpu))
    h, i = hidden, intermediate
    return InferenceProfile(source="preset", cluster="test", model=model, family=family, num_layers=layers,
                            hidden=h, heads=heads, intermediate=i, attention_bytes=(4 * h * h + 4 * h) * 4,
                            mlp_bytes=(2 * h * i + i + h) * 4, devices=devices, default_bytes_per_s=bandwidth)


def near_equal_hosts_profile(ring_cpu: float):
    """Three lab hosts (0.084 core, one thread), the second measured 3 % faster (as identical hosts'
    profiles do), 16 heads, a slow link (20 MB/s), and the ring's communication CPU per byte at
    `ring_cpu` against the AllReduce's 1.8 ns: at 2.4e-9 galaxy's ring is predicted 2.8 % faster than
    Megatron's program, at 1.0e-9 more than 5 %."""
    return make_inference_profile(speeds=(1.0, 1.03, 1.0), heads=16, hidden=64, bandwidth=20e6,
                                  allreduce_cpu=1.8e-9, cpu_cores=0.084, threads=1, comm_cpu=ring_cpu)
