"""Tiny random-init Llama, Qwen2, Qwen3, Granite, SmolLM3, Gemma 3 and
mixture-of-experts (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE) checkpoints written with
`transformers` (the numeric reference), saved as safetensors and as GGUF
(written with `gguf`'s GGUFWriter the way llama.cpp's converter writes them:
its tensor names, its Q/K row permutation for the llama architecture, its
`rope_freqs` for Llama 3 RoPE scaling, Gemma's norms stored as `1 + weight`
and its sliding window in the metadata)."""

from __future__ import annotations

import os

import numpy as np
import torch

#: Small enough to build and run in a second, big enough for GQA and chunks.
COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
CONFIGS = {
    "llama": dict(
        architectures=["LlamaForCausalLM"],
        rope_theta=10000.0,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "mistral": dict(
        architectures=["MistralForCausalLM"], rope_theta=10000.0, tie_word_embeddings=False, sliding_window=None
    ),
    "qwen2": dict(architectures=["Qwen2ForCausalLM"], rope_theta=1000000.0, tie_word_embeddings=True),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], rope_theta=1000000.0, tie_word_embeddings=False, head_dim=32),
    # Every multiplier away from 1 (and the attention one from head_dim's).
    "granite": dict(
        architectures=["GraniteForCausalLM"],
        rope_theta=10000.0,
        tie_word_embeddings=True,
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.2,
        logits_scaling=1.5,
    ),
    # Partial rotary (half of each head) and LongRoPE's short factors with
    # an attention factor (max_position_embeddings past the original).
    "phi3": dict(
        architectures=["Phi3ForCausalLM"],
        tie_word_embeddings=False,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        sliding_window=None,
        max_position_embeddings=1024,
        original_max_position_embeddings=256,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "short_factor": [1.0, 1.3, 1.7, 2.2],
            "long_factor": [2.0, 3.0, 4.0, 5.0],
        },
    ),
    # 4 layers, the 2nd and 4th without RoPE.
    "smollm3": dict(
        architectures=["SmolLM3ForCausalLM"],
        rope_theta=10000.0,
        tie_word_embeddings=True,
        num_hidden_layers=4,
        no_rope_layer_interval=2,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    ),
    # 6 layers: llama.cpp makes every 6th layer global (5 windowed, 1 global);
    # a window of 8 is shorter than most test prompts; linear RoPE scaling on
    # the global layers only; query_pre_attn_scalar unlike head_dim, which
    # is what a GGUF (that cannot say it) gets: gemma3_gguf_model.
    "gemma3_text": dict(
        architectures=["Gemma3ForCausalLM"],
        num_hidden_layers=6,
        head_dim=32,
        sliding_window=8,
        query_pre_attn_scalar=24,
        tie_word_embeddings=True,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
    # The mixtures of experts: several experts, top 2, each router's own
    # normalization; Qwen-MoE with dense layers among the sparse ones.
    "mixtral": dict(
        architectures=["MixtralForCausalLM"], rope_theta=10000.0, tie_word_embeddings=False, sliding_window=None,
        num_local_experts=6, num_experts_per_tok=2,
    ),
    "olmoe": dict(
        architectures=["OlmoeForCausalLM"], rope_theta=10000.0, tie_word_embeddings=False, num_experts=6,
        num_experts_per_tok=2, norm_topk_prob=False, pad_token_id=None, bos_token_id=None, eos_token_id=None,
    ),
    # Layer 1 dense (`mlp_only_layers`); a shared expert with its gate; q/k/v bias.
    "qwen2_moe": dict(
        architectures=["Qwen2MoeForCausalLM"], rope_theta=1000000.0, tie_word_embeddings=False,
        num_hidden_layers=3, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=48,
        shared_expert_intermediate_size=80, norm_topk_prob=False, mlp_only_layers=[1], qkv_bias=True,
    ),
    # Every 2nd layer sparse (`decoder_sparse_step`), the first dense.
    "qwen3_moe": dict(
        architectures=["Qwen3MoeForCausalLM"], rope_theta=1000000.0, tie_word_embeddings=False, head_dim=32,
        num_hidden_layers=3, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True,
        decoder_sparse_step=2,
    ),
}  # fmt: skip
#: Hugging Face names -> llama.cpp's (per layer after `model.layers.N.`).
GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    # Phi-3's fused projections (llama.cpp's phi3 keeps them fused).
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
}
#: A mixture of experts' router and Qwen2-MoE's shared expert (the routed
#: experts are stacked: `_gguf_experts`).
GGUF_MOE_LAYER_NAMES = {
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
#: llama.cpp's architecture of each mixture of experts (Mixtral is its `llama`).
GGUF_MOE_ARCHES = {"mixtral": "llama", "olmoe": "olmoe", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}
GGUF_GEMMA3_LAYER_NAMES = {
    **GGUF_LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def make_hf_model(arch: str, seed: int = 0, **sizes):
    """A transformers model of `arch` with random weights that give peaked
    logits (so greedy decoding has no near-ties), every weight exactly
    representable in float16 (so an F16 GGUF holds the same model);
    `sizes` override COMMON's (`hidden_size=256`, ...)."""
    import transformers

    config = transformers.AutoConfig.for_model(arch, **{**COMMON, **CONFIGS[arch], **sizes})
    config.dtype = "float32"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                value = 1.0 + 0.2 * torch.randn_like(param)
            else:
                value = torch.randn_like(param) * (0.5 if "embed" in name or "lm_head" in name else 0.15)
            param.copy_(value.half().float())
    return model


def gemma3_gguf_model(seed: int = 0):
    """A tiny Gemma 3 that a GGUF holds whole: llama.cpp scales the scores
    by `head_dim` (`query_pre_attn_scalar` is not in its metadata)."""
    return make_hf_model("gemma3_text", seed, query_pre_attn_scalar=CONFIGS["gemma3_text"]["head_dim"])


def save_safetensors(model, path: str, max_shard_size: str | None = None) -> str:
    """Writes the Hugging Face directory (config.json, *.safetensors,
    sharded with an index when `max_shard_size` is small); returns `path`."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    return path


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation (LlamaModel.permute)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def save_gguf(
    model, path: str, f16: bool = False, quant: dict[str, str] | None = None, stacked_experts: bool = True
) -> str:
    """Writes `model` as one GGUF file (2-D weights and 3-D stacked experts
    F16 when `f16`, norms, biases and routers F32, as llama.cpp's converter
    does; `quant` maps a substring of GGUF tensor names to the ggml type
    those weights get, e.g. `{"ffn_": "Q4_0"}`, any type the kernel reads:
    types the `gguf` package cannot quantize get random blocks,
    `gguf_blocks.quantize`; `stacked_experts` False: one 2-D tensor per
    expert, `blk.L.ffn_gate.E.weight`, as llama.cpp's first Mixtral GGUFs);
    returns `path`."""
    import gguf

    from tests.support.gguf_blocks import quantize

    config = model.config
    arch = config.model_type
    gemma = arch == "gemma3_text"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if gemma and config.query_pre_attn_scalar != head_dim:
        raise ValueError("a gemma3 GGUF scales attention by head_dim: query_pre_attn_scalar must equal it")
    writer = gguf.GGUFWriter(path, "gemma3" if gemma else GGUF_MOE_ARCHES.get(arch, arch))
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta, **(config.rope_scaling or {})}
    if gemma:
        rope = rope["full_attention"]  # the windowed layers' base is llama.cpp's fixed 10000
        writer.add_sliding_window(config.sliding_window)
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if arch != "phi3":
        writer.add_rope_dimension_count(head_dim)
    if arch == "phi3":
        rope_params = config.rope_parameters
        rotary = int(head_dim * rope_params.get("partial_rotary_factor", 1.0))
        writer.add_rope_dimension_count(rotary)
        if rope_params.get("rope_type") == "longrope":
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            _, attention = ROPE_INIT_FUNCTIONS["longrope"](config)
            writer.add_rope_scaling_attn_factors(attention)
            writer.add_rope_scaling_orig_ctx_len(rope_params["original_max_position_embeddings"])
    if arch == "granite":
        writer.add_attention_scale(config.attention_multiplier)
        writer.add_embedding_scale(config.embedding_multiplier)
        writer.add_residual_scale(config.residual_multiplier)
        writer.add_logit_scale(config.logits_scaling)
    if arch == "smollm3" and list(config.no_rope_layers) != [
        int((i + 1) % 4 != 0) for i in range(config.num_hidden_layers)
    ]:
        raise ValueError("a smollm3 GGUF runs every 4th layer without RoPE: no_rope_layer_interval must be 4")
    if arch in GGUF_MOE_ARCHES:
        # As llama.cpp's converter writes them (TextModel, Qwen2MoeModel).
        writer.add_expert_count(getattr(config, "num_local_experts", None) or config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        if getattr(config, "moe_intermediate_size", None):
            writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        if getattr(config, "shared_expert_intermediate_size", None):
            writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(config.vocab_size)])
    tensors: dict[str, np.ndarray] = {}
    for name, param in model.state_dict().items():
        array = param.float().numpy()
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif name == "lm_head.weight":
            if config.tie_word_embeddings:
                continue
            gguf_name = "output.weight"
        elif name.endswith(".mlp.experts.gate_up_proj"):
            # transformers' fused experts ([experts, gate; up, hidden]) as
            # llama.cpp's stacked ones, each [experts, out, in].
            layer = name.split(".")[2]
            gate, up = np.split(array, 2, axis=1)
            tensors[f"blk.{layer}.ffn_gate_exps.weight"] = gate
            tensors[f"blk.{layer}.ffn_up_exps.weight"] = up
            continue
        elif name.endswith(".mlp.experts.down_proj"):
            gguf_name = f"blk.{name.split('.')[2]}.ffn_down_exps.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            names = GGUF_GEMMA3_LAYER_NAMES if gemma else {**GGUF_LAYER_NAMES, **GGUF_MOE_LAYER_NAMES}
            gguf_name = f"blk.{layer}.{names[rest]}"
            # llama.cpp's LlamaModel and its subclasses (Mixtral's included).
            permuted = arch in ("llama", "granite", "smollm3", "mixtral")
            if permuted and rest == "self_attn.q_proj.weight":
                array = _permute(array, config.num_attention_heads)
            elif permuted and rest == "self_attn.k_proj.weight":
                array = _permute(array, config.num_key_value_heads)
        if gemma and name.endswith("norm.weight"):
            array = array + 1  # llama.cpp's converter stores Gemma's norms as 1 + weight
        # The converter squeezes (Qwen2-MoE's shared expert gate: [hidden]).
        tensors[gguf_name] = array.squeeze()
    if arch == "phi3" and rope.get("rope_type") == "longrope":
        tensors["rope_factors_long.weight"] = np.asarray(rope["long_factor"], np.float32)
        tensors["rope_factors_short.weight"] = np.asarray(rope["short_factor"], np.float32)
    if not stacked_experts:
        for name in [n for n in tensors if n.endswith("_exps.weight")]:
            stacked = tensors.pop(name)
            for e, weight in enumerate(stacked):
                tensors[name.replace("_exps.weight", f".{e}.weight")] = weight
    if rope.get("rope_type") == "llama3":
        # llama.cpp stores Llama 3 scaling as per-frequency divisors.
        base = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        tensors["rope_freqs.weight"] = (base / model.model.rotary_emb.inv_freq.float()).numpy()
    for name, array in tensors.items():
        kind = next((k for part, k in (quant or {}).items() if part in name), None)
        if name.endswith("ffn_gate_inp.weight"):
            # The routers stay float32 (the converter's and llama-quantize's rule).
            writer.add_tensor(name, array.astype(np.float32))
        elif kind is not None and array.ndim >= 2:
            # Quantized by rows (each expert's rows, for stacked experts).
            rows = quantize(kind, array.reshape(-1, array.shape[-1]).astype(np.float32))
            data = rows.reshape(*array.shape[:-1], rows.shape[-1])
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[kind])
        elif f16 and array.ndim >= 2:
            writer.add_tensor(name, array.astype(np.float16))
        else:
            writer.add_tensor(name, array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def checkpoint_dir(root: str, name: str) -> str:
    """A fresh directory under `root`."""
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    return path
