"""A Llama-architecture decoder in PyTorch, two ways: with its K/V in a
kvshare pool (what the engine runs) and from scratch with plain causal
attention and no cache at all (what every answer is checked against).

The architecture is the one of Meta's Llama and of `transformers`'
LlamaForCausalLM: token embedding; per layer RMSNorm, grouped-query
attention with rotary position embedding (the "rotate half" form), a
residual, RMSNorm, a SwiGLU MLP and a residual; a final RMSNorm and the
output projection.  Weights come from a seed or from a safetensors file
whose tensors carry the names `transformers` gives them
(model.layers.N.self_attn.q_proj.weight, ...), so a real checkpoint of
this architecture loads as it is.
"""
import json
import math
import struct
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Config:
    vocab: int = 512
    dim: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 32
    ffn: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of "
                             f"kv_heads {self.kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} is odd (rotary "
                             f"embedding rotates pairs)")

    def as_dict(self):
        return asdict(self)


# Sizes on the command line (--model NAME).
CONFIGS = {
    # what the CPU runs in tests and `make engine`
    "tiny": Config(vocab=256, dim=64, layers=2, heads=4, kv_heads=2,
                   head_dim=16, ffn=128),
    "small": Config(),
    # ~1.1B parameters, TinyLlama's shape: for a GPU
    "1b": Config(vocab=32000, dim=2048, layers=22, heads=32, kv_heads=4,
                 head_dim=64, ffn=5632),
}


def weight_names(cfg):
    """Name -> shape of every weight, as transformers names them."""
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    w = {"model.embed_tokens.weight": (cfg.vocab, cfg.dim)}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = (cfg.dim,)
        w[p + "self_attn.q_proj.weight"] = (q, cfg.dim)
        w[p + "self_attn.k_proj.weight"] = (kv, cfg.dim)
        w[p + "self_attn.v_proj.weight"] = (kv, cfg.dim)
        w[p + "self_attn.o_proj.weight"] = (cfg.dim, q)
        w[p + "post_attention_layernorm.weight"] = (cfg.dim,)
        w[p + "mlp.gate_proj.weight"] = (cfg.ffn, cfg.dim)
        w[p + "mlp.up_proj.weight"] = (cfg.ffn, cfg.dim)
        w[p + "mlp.down_proj.weight"] = (cfg.dim, cfg.ffn)
    w["model.norm.weight"] = (cfg.dim,)
    w["lm_head.weight"] = (cfg.vocab, cfg.dim)
    return w


def seeded_weights(cfg, seed, dtype=torch.float32):
    """Random weights: matrices N(0, 1/fan_in), norms around 1."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in weight_names(cfg).items():
        if len(shape) == 1:
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / math.sqrt(shape[1])
            if name == "model.embed_tokens.weight":
                t = t * math.sqrt(shape[1])  # rows of norm ~sqrt(dim)
        out[name] = t.to(dtype)
    return out


# ---- safetensors (the format: an 8-byte little-endian header size, a JSON
# header naming each tensor's dtype, shape and byte range, then the bytes) --

_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16,
              "BF16": torch.bfloat16}
_ST_SIZES = {"F32": 4, "F16": 2, "BF16": 2}


def save_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous().cpu()
        code = [k for k, v in _ST_DTYPES.items() if v == t.dtype]
        if not code:
            raise ValueError(f"{name}: dtype {t.dtype} not supported")
        raw = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 \
            else t.numpy().tobytes()
        header[name] = {"dtype": code[0], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path}: header of {n} bytes past the end")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:    # (bad JSON or bad UTF-8)
        raise ValueError(f"{path}: the header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header is not a JSON object")
    base, out = 8 + n, {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(d, dict) or not {"dtype", "shape",
                                           "data_offsets"} <= set(d):
            raise ValueError(f"{path}: {name}: not a tensor entry (dtype, "
                             f"shape, data_offsets)")
        if d["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{path}: {name}: dtype {d['dtype']} not "
                             f"supported (F32, F16, BF16)")
        shape, offs = d["shape"], d["data_offsets"]
        if not isinstance(shape, list) or not all(
                type(x) is int and x >= 0 for x in shape):
            raise ValueError(f"{path}: {name}: shape {shape!r} is not a "
                             f"list of non-negative integers")
        if not isinstance(offs, list) or len(offs) != 2 or not all(
                type(x) is int for x in offs):
            raise ValueError(f"{path}: {name}: data_offsets {offs!r} is not "
                             f"[begin, end]")
        a, b = offs
        if not 0 <= a <= b <= len(data) - base:
            raise ValueError(f"{path}: {name}: bytes out of the file")
        want = math.prod(shape) * _ST_SIZES[d["dtype"]]
        if b - a != want:
            raise ValueError(f"{path}: {name}: {b - a} bytes for shape "
                             f"{shape} of {d['dtype']}, which takes {want}")
        buf = bytearray(data[base + a:base + b])
        t = torch.frombuffer(buf, dtype=_ST_DTYPES[d["dtype"]]) if buf else \
            torch.empty(0, dtype=_ST_DTYPES[d["dtype"]])
        out[name] = t.reshape(d["shape"])
    return out


def load_weights(cfg, path=None, seed=1):
    """The weights of cfg: from the safetensors file at path, else
    seeded."""
    return load_safetensors(path) if path else seeded_weights(cfg, seed)


def check_weights(cfg, w):
    want = weight_names(cfg)
    missing = [n for n in want if n not in w]
    if missing:
        raise ValueError(f"weights lack {missing[0]} (and {len(missing) - 1} "
                         f"more)" if len(missing) > 1 else
                         f"weights lack {missing[0]}")
    for n, shape in want.items():
        if tuple(w[n].shape) != shape:
            raise ValueError(f"{n}: shape {tuple(w[n].shape)}, the config "
                             f"wants {shape}")


# ---- the model -------------------------------------------------------------

class Llama:
    """The weights and the pieces of a forward pass, on one device and in
    one compute dtype."""

    def __init__(self, cfg, weights, device="cpu", dtype=torch.float32):
        check_weights(cfg, weights)
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        self.w = {n: t.to(self.device, dtype) for n, t in weights.items()}
        half = cfg.head_dim // 2
        # on the model's device, beside the positions it meets (float64:
        # the angles of long positions keep their digits)
        self.inv_freq = (1.0 / (cfg.rope_theta ** (
            torch.arange(half, dtype=torch.float64) * 2 / cfg.head_dim))
        ).to(self.device)

    def layer(self, i, name):
        return self.w[f"model.layers.{i}.{name}.weight"]

    def rms_norm(self, x, weight):
        x32 = x.float()
        r = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) +
                              self.cfg.norm_eps)
        return (r.to(x.dtype)) * weight

    def rope(self, x, positions):
        """x [rows, heads, head_dim] at positions [rows] (rotate-half)."""
        ang = (positions.to(self.device, torch.float64)[:, None] *
               self.inv_freq[None, :])
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
        sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos[:, None, :] + rot * sin[:, None, :]

    def qkv(self, i, x, positions):
        c = self.cfg
        h = self.rms_norm(x, self.layer(i, "input_layernorm"))
        q = (h @ self.layer(i, "self_attn.q_proj").T).view(-1, c.heads,
                                                            c.head_dim)
        k = (h @ self.layer(i, "self_attn.k_proj").T).view(-1, c.kv_heads,
                                                            c.head_dim)
        v = (h @ self.layer(i, "self_attn.v_proj").T).view(-1, c.kv_heads,
                                                            c.head_dim)
        return self.rope(q, positions), self.rope(k, positions), v

    def after_attention(self, i, x, attn):
        """The residual, the MLP and its residual, given attention's output
        [rows, heads, head_dim]."""
        x = x + attn.reshape(x.shape[0], -1) @ self.layer(i, "self_attn.o_proj").T
        h = self.rms_norm(x, self.layer(i, "post_attention_layernorm"))
        g = h @ self.layer(i, "mlp.gate_proj").T
        u = h @ self.layer(i, "mlp.up_proj").T
        return x + (torch.nn.functional.silu(g) * u) @ self.layer(
            i, "mlp.down_proj").T

    def logits(self, x):
        return self.rms_norm(x, self.w["model.norm.weight"]) @ \
            self.w["lm_head.weight"].T

    def embed(self, tokens):
        return self.w["model.embed_tokens.weight"][tokens]

    # -- from scratch, no cache ------------------------------------------
    def forward_full(self, tokens, kv_dtype=None):
        """Logits [n, vocab] of every position of one sequence, computed
        from nothing: plain causal attention over the whole sequence.
        kv_dtype: round K and V through it first, as a cache of that
        dtype holds them."""
        c = self.cfg
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        n = tokens.numel()
        pos = torch.arange(n, device=self.device)
        x = self.embed(tokens)
        mask = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        group = c.heads // c.kv_heads
        for i in range(c.layers):
            q, k, v = self.qkv(i, x, pos)
            if kv_dtype is not None:
                k, v = k.to(kv_dtype).to(x.dtype), v.to(kv_dtype).to(x.dtype)
            k = k.repeat_interleave(group, dim=1)   # [n, heads, hd]
            v = v.repeat_interleave(group, dim=1)
            s = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / \
                math.sqrt(c.head_dim)
            s = s.masked_fill(~mask, float("-inf"))
            p = torch.softmax(s, -1)
            a = torch.einsum("hqk,khd->qhd", p, v.float()).to(x.dtype)
            x = self.after_attention(i, x, a)
        return self.logits(x)


def transformers_llama(cfg, weights, device="cpu"):
    """transformers' LlamaForCausalLM with the same weights (float32, eval
    mode), or None when transformers is not installed: an implementation
    of the architecture nobody here wrote, to check this one against."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    if cfg.dim != cfg.heads * cfg.head_dim:
        raise ValueError(f"transformers' Llama wants dim == heads x head_dim "
                         f"({cfg.dim} != {cfg.heads} x {cfg.head_dim})")
    hc = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.dim,
                     intermediate_size=cfg.ffn, num_hidden_layers=cfg.layers,
                     num_attention_heads=cfg.heads,
                     num_key_value_heads=cfg.kv_heads,
                     rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
                     max_position_embeddings=1 << 16,
                     tie_word_embeddings=False, attention_bias=False)
    m = LlamaForCausalLM(hc)
    m.load_state_dict({n: t.float() for n, t in weights.items()}, strict=True)
    return m.to(device).eval()
