"""The MoE decoder: RMSNorm, RoPE, GQA attention through SDPA, dense or MoE SwiGLU FFNs.

Single-device code: data/expert/tensor parallelism is applied from outside (e.g. by replacing
MoELayer.compute_experts or wrapping modules), so nothing here knows about process groups.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from sigma.train.config import ModelConfig
from sigma.train.moe import FeedForward, GroupedExperts, MoELayer


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_seq_len, head_dim] for the rotate-half RoPE convention (Llama, Mixtral)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def queries_keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, H, T, D] and k [B, H_kv, T, D] as SDPA sees them (qk-norm and RoPE applied)."""
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k = self.queries_keys(x, cos, sin)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.is_moe = layer_id >= cfg.n_dense_layers
        self.ffn = MoELayer(cfg) if self.is_moe else FeedForward(cfg.dim, cfg.dense_hidden)
        self.dropout = cfg.dropout

    def drop(self, y: torch.Tensor) -> torch.Tensor:
        return F.dropout(y, self.dropout, self.training) if self.dropout else y

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = x + self.drop(self.attn(self.attn_norm(x), cos, sin))
        if self.is_moe:
            y, aux = self.ffn(self.ffn_norm(x))
            return x + self.drop(y), aux
        return x + self.drop(self.ffn(self.ffn_norm(x))), None


class MoETransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, T] -> (logits [B, T, vocab], aux_loss scalar: sum over MoE layers, already coefficient-scaled)."""
        t = tokens.shape[1]
        if t > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {t} exceeds max_seq_len {self.cfg.max_seq_len}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.tok_embeddings(tokens)
        aux_total = torch.zeros((), device=x.device, dtype=torch.float32)
        for layer in self.layers:
            if self.cfg.activation_checkpointing and self.training and torch.is_grad_enabled():
                # Recomputed in the backward with the RNG state of the forward (same router jitter).
                x, aux = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x, aux = layer(x, cos, sin)
            if aux is not None:
                aux_total = aux_total + aux
        return self.output(self.norm(x)), aux_total

    def moe_layers(self) -> list[MoELayer]:
        return [layer.ffn for layer in self.layers if layer.is_moe]

    @torch.no_grad()
    def init_weights(self) -> None:
        """gaussian: every matrix N(0, init_std). scaled (Megatron): output projections (attention wo, FFN and expert
        w2) use init_std / sqrt(2 n_layers) so the residual stream's variance does not grow with depth.

        Also fills the RoPE tables and balancing buffers, so a model built on the meta device and materialised
        with to_empty() is complete after this call."""
        cfg = self.cfg
        if self.rope_cos.device.type != "meta":
            cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)
        std = cfg.init_std
        out_std = std / math.sqrt(2 * cfg.n_layers) if cfg.init == "scaled" else std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
            elif isinstance(module, GroupedExperts):
                module.reset_parameters(std, out_std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
            elif isinstance(module, MoELayer):
                module.expert_bias.zero_()
                module.last_load.zero_()
        for layer in self.layers:
            nn.init.normal_(layer.attn.wo.weight, 0.0, out_std)
            ffn = layer.ffn
            for dense in (ffn.shared,) if isinstance(ffn, MoELayer) else (ffn,):
                if dense is not None:
                    nn.init.normal_(dense.w2.weight, 0.0, out_std)
        if cfg.tie_embeddings:
            nn.init.normal_(self.tok_embeddings.weight, 0.0, std)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
