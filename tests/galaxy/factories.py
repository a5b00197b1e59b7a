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
