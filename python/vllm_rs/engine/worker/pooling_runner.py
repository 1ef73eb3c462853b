"""Runs a pooling model for one engine: every scheduled input is computed
whole in one forward pass (no KV cache is kept) and pooled into one vector
as vLLM pools it: the first token (CLS), the mean of all tokens (MEAN) or
the last token (LAST), then for an embedding cut to `dimensions` and
L2-normalized, for a classifier its logits with the activation (sigmoid for
one label, softmax for more). The model is a BERT encoder (`models/bert.py`,
bidirectional) or a decoder (`llama.CausalLM`, causal) whose final-normed
hidden states are pooled."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm_rs.engine.config import EngineConfig
from vllm_rs.engine.cpu_threads import limit_cpu_threads
from vllm_rs.engine.layers.rotary_embedding import rope_tables
from vllm_rs.engine.models.bert import BertEncoder, load_bert
from vllm_rs.engine.pooling_params import Matryoshka, PoolingParams
from vllm_rs.engine.sched.output import ModelOutput, StepPlan
from vllm_rs.engine.sched.request import Request
from vllm_rs.engine.worker.torch_executor import resolve_device
from vllm_rs.logger import init_logger
from vllm_rs.tensor_utils import compute_iteration_details

logger = init_logger(__name__)


def pool(hidden: torch.Tensor, pooling_type: str) -> torch.Tensor:
    """One input's vector from its hidden states `[tokens, hidden]`."""
    if pooling_type == "CLS":
        return hidden[0]
    if pooling_type == "LAST":
        return hidden[-1]
    return hidden.mean(dim=0)


def embed_head(pooled: torch.Tensor, params: PoolingParams) -> torch.Tensor:
    """An embedding: cut to `dimensions` (Matryoshka), then normalized when asked."""
    if params.dimensions is not None:
        pooled = pooled[: params.dimensions]
    return F.normalize(pooled, p=2, dim=-1) if params.use_activation else pooled


def classify_activation(logits: torch.Tensor, params: PoolingParams) -> torch.Tensor:
    """Class scores: the logits through sigmoid (one label) or softmax, when asked."""
    if not params.use_activation:
        return logits
    return torch.sigmoid(logits) if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)


class CausalAttention(nn.Module):
    """Stands in for a decoder layer's paged attention: each input's queries
    attend causally over its own keys, nothing cached."""

    def __init__(self, num_heads: int, num_kv_heads: int):
        super().__init__()
        self.groups = num_heads // num_kv_heads

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: list[tuple[int, int]]) -> torch.Tensor:
        """`q`: `[tokens, heads, dim]`, `k`/`v`: `[tokens, kv_heads, dim]`; `meta`: each input's rows."""
        out = torch.empty_like(q)
        for start, end in meta:
            qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
            if self.groups > 1:
                ks, vs = ks.repeat_interleave(self.groups, 0), vs.repeat_interleave(self.groups, 0)
            out[start:end] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1)
        return out.reshape(q.shape[0], -1)


class PoolingRunner:
    """A pooling model (BERT, or a decoder) and its pooler."""

    #: No KV cache, so no blocks.
    num_gpu_blocks = 0
    #: Pooling generates nothing a grammar could steer.
    follows_grammars = False

    def __init__(self, config: EngineConfig):
        self.device = resolve_device(config.device_config.device)
        if self.device.type == "cpu":
            limit_cpu_threads(config)
        model_config = config.model_config
        spec = model_config.spec
        self.dtype = getattr(torch, model_config.dtype)
        self.task = model_config.runner.task
        self.pooler = model_config.pooler
        self.model_name = model_config.model
        if spec.is_encoder:
            self.model: nn.Module = load_bert(spec.encoder, spec.weight_files, self.dtype, self.device)
            self.matryoshka = Matryoshka(
                spec.encoder.is_matryoshka, spec.encoder.matryoshka_dimensions, spec.encoder.hidden_size
            )
            self.num_labels = spec.encoder.num_labels
        else:
            from vllm_rs.engine.model_loader.weights import load_model

            self.model = load_model(spec, self.dtype, self.device, model_config.quantization)
            for layer in self.model.model.layers:
                layer.self_attn.attn = CausalAttention(spec.transformer.num_heads, spec.transformer.num_kv_heads)
            self.matryoshka = Matryoshka(False, (), spec.transformer.hidden_size)
            self.num_labels = 0
        logger.info(
            "%s (%s) pooling for %s on %s (%s, activation %s)", model_config.architecture, model_config.dtype,
            self.task, self.device, self.pooler.pooling_type, self.pooler.use_activation,
        )  # fmt: skip

    def check(self, params: PoolingParams) -> None:
        """Resolves and checks a request's params against this model
        (InvalidRequestError in vLLM's words)."""
        params.verify(self.task, self.pooler, self.model_name, self.matryoshka)

    def block_hasher(self) -> None:
        """No prefix cache."""
        return None

    def iteration_details(self, plan: StepPlan):
        """Context requests and tokens of the step."""
        return compute_iteration_details(plan)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> ModelOutput:
        """Pools every scheduled request (each scheduled whole)."""
        requests = plan.requests
        if not requests:
            return ModelOutput()
        if isinstance(self.model, BertEncoder):
            rows = self._encode(requests)
        else:
            rows = self._decode(requests)
        out = ModelOutput()
        for request, hidden in zip(requests, rows, strict=True):
            params: PoolingParams = request.pooling_params
            if self.task == "classify":
                logits = self.model.classify(hidden[0:1]).float()[0]
                vector = classify_activation(logits, params)
            else:
                vector = embed_head(pool(hidden, self.pooler.pooling_type).float(), params)
            out.pooled[request.request_id] = vector.cpu()
        return out

    def _encode(self, requests: list[Request]) -> list[torch.Tensor]:
        """Each request's hidden states from one unpadded BERT pass."""
        ids, types, positions, bounds = [], [], [], []
        for request in requests:
            n, start = request.num_prompt_tokens, request.pooling_params.token_type_start
            first = len(ids)
            ids.extend(request.prompt_token_ids)
            types.extend([0] * n if start is None else [0] * start + [1] * (n - start))
            positions.extend(range(n))
            bounds.append((first, first + n))
        tensors = [torch.tensor(t, device=self.device) for t in (ids, types, positions)]
        hidden = self.model(*tensors, bounds)
        return [hidden[a:b] for a, b in bounds]

    def _decode(self, requests: list[Request]) -> list[torch.Tensor]:
        """Each request's final-normed hidden states from one flattened decoder pass."""
        ids = torch.tensor([t for r in requests for t in r.prompt_token_ids], device=self.device)
        positions = torch.cat([torch.arange(r.num_prompt_tokens) for r in requests]).to(self.device)
        bounds, start = [], 0
        for request in requests:
            bounds.append((start, start + request.num_prompt_tokens))
            start += request.num_prompt_tokens
        backbone = self.model.model
        x = backbone.embed_tokens(ids)
        cos, sin = rope_tables(positions, self.model.inv_freq, x.dtype)
        for layer in backbone.layers:
            x = layer.forward(x, cos, sin, bounds)
        hidden = backbone.norm.forward(x)
        return [hidden[a:b] for a, b in bounds]
