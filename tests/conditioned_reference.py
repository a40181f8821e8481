"""Reference implementations of DFlash and EAGLE-3 drafting, written from the papers' and official
code's semantics with plain tensor ops on a checkpoint's raw state dict: no cache, everything
recomputed from the committed sequence at every draft (slow, obviously right). The tests compare
the drafters (cached, incremental) against them, and build tiny checkpoints in the official
layouts by hand (not through specpolicy's writers)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def committed_after(committed: torch.Tensor, r) -> torch.Tensor:
    """``committed`` ``(n,) int64`` followed by round ``r``'s accepted draft tokens and its correction
    or bonus token: what the loop has committed after that round."""
    accepted = torch.tensor(r.draft_token_ids[: r.accepted_length], dtype=torch.long)
    return torch.cat([committed, accepted, torch.tensor(r.target_token_ids[r.accepted_length : r.accepted_length + 1])])


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (w.float() * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x: (n, heads, d); positions (n,)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = positions[:, None].float() * inv[None]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().to(x.dtype)[:, None], emb.sin().to(x.dtype)[:, None]
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + half * sin


def attend(q, k, v, allowed):
    """q (nq, h, d), k/v (nk, kvh, d), allowed (nq, nk) bool -> (nq, h * d)."""
    h, kvh, d = q.shape[1], k.shape[1], q.shape[2]
    k, v = k.repeat_interleave(h // kvh, 1), v.repeat_interleave(h // kvh, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / d**0.5
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(q.shape[0], h * d)


def mlp(x, sd, prefix):
    gate = x @ sd[prefix + "gate_proj.weight"].T
    return (torch.nn.functional.silu(gate) * (x @ sd[prefix + "up_proj.weight"].T)) @ sd[prefix + "down_proj.weight"].T


# -- DFlash ------------------------------------------------------------------------------------


def write_dflash_checkpoint(
    directory: Path,
    hidden: int,
    vocab: int,
    num_target_layers: int,
    layer_ids: list[int],
    block_size: int,
    mask_id: int,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 8,
    inter: int = 64,
    seed: int = 0,
    top_level: bool = False,
    draft_vocab: list[int] | None = None,
) -> Path:
    """A random DFlash checkpoint in the official layout; ``top_level``: block_size / mask_token_id
    at the top level of config.json as older checkpoints have them; ``draft_vocab``: target ids of
    a draft vocabulary (``draft_vocab_size`` and ``d2t``, the opt-in extension)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for i in range(layers):
        p = f"layers.{i}."
        shapes = {
            "self_attn.q_proj.weight": (heads * head_dim, hidden),
            "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            "self_attn.o_proj.weight": (hidden, heads * head_dim),
            "mlp.gate_proj.weight": (inter, hidden),
            "mlp.up_proj.weight": (inter, hidden),
            "mlp.down_proj.weight": (hidden, inter),
        }
        for name, shape in shapes.items():
            sd[p + name] = torch.randn(shape, generator=g) * 0.2
        for name, n in (
            ("self_attn.q_norm.weight", head_dim),
            ("self_attn.k_norm.weight", head_dim),
            ("input_layernorm.weight", hidden),
            ("post_attention_layernorm.weight", hidden),
        ):
            sd[p + name] = 1 + 0.1 * torch.randn(n, generator=g)
    sd["fc.weight"] = torch.randn(hidden, len(layer_ids) * hidden, generator=g) * 0.1
    sd["hidden_norm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=g)
    sd["norm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=g)
    if draft_vocab is not None:
        sd["d2t"] = torch.tensor(draft_vocab, dtype=torch.long) - torch.arange(len(draft_vocab))
    directory.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(directory / "model.safetensors"))
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
        "attention_bias": False,
        "num_target_layers": num_target_layers,
        "block_size": block_size,
        "dflash_config": {"target_layer_ids": layer_ids, "mask_token_id": mask_id},
    }
    if draft_vocab is not None:
        config["dflash_config"]["draft_vocab_size"] = len(draft_vocab)
    if top_level:
        config["mask_token_id"] = config["dflash_config"].pop("mask_token_id")
    else:
        config["dflash_config"]["block_size"] = block_size
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def dflash_reference(
    directory: Path, target, committed: torch.Tensor, given: torch.Tensor | None = None
) -> torch.Tensor:
    """The B - 1 tokens DFlash drafts after ``committed`` ((c,) int64; the last token is the block's
    first), recomputing the target's features of ``committed[:-1]``; ``given``: drafted tokens placed
    before the masks (an extension pass). Returns (B - 1,) int64 greedy tokens (target ids; with a
    draft vocabulary, the argmax over its ids' logits)."""
    from safetensors.torch import load_file

    cfg = json.loads((directory / "config.json").read_text())
    sd = {k: v.float() for k, v in load_file(str(directory / "model.safetensors")).items()}
    dc = cfg["dflash_config"]
    B = dc.get("block_size", cfg.get("block_size"))
    mask_id = dc.get("mask_token_id", cfg.get("mask_token_id"))
    heads, kvh, hd, eps, theta = (
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
        cfg["rms_norm_eps"],
        cfg["rope_theta"],
    )
    c = committed.shape[0]
    with torch.no_grad():
        if c > 1:
            hs = target(input_ids=committed[None, :-1], output_hidden_states=True).hidden_states
            feats = torch.cat([hs[i + 1][0] for i in dc["target_layer_ids"]], -1).float()
        else:
            feats = torch.zeros(0, sd["fc.weight"].shape[1])
        ctx = rms(feats @ sd["fc.weight"].T, sd["hidden_norm.weight"], eps)
        given = committed.new_zeros(0) if given is None else given
        block = torch.cat([committed[-1:], given, torch.full((B - 1,), mask_id)])
        x = target.get_input_embeddings()(block).float()
        pos_ctx, pos_blk = torch.arange(c - 1), torch.arange(c - 1, c - 1 + block.shape[0])
        for i in range(cfg["num_hidden_layers"]):
            p = f"layers.{i}."
            h = rms(x, sd[p + "input_layernorm.weight"], eps)
            q = rms(
                (h @ sd[p + "self_attn.q_proj.weight"].T).view(-1, heads, hd), sd[p + "self_attn.q_norm.weight"], eps
            )

            def kv(src, pos):
                k = rms(
                    (src @ sd[p + "self_attn.k_proj.weight"].T).view(-1, kvh, hd),
                    sd[p + "self_attn.k_norm.weight"],
                    eps,
                )
                return rope(k, pos, theta), (src @ sd[p + "self_attn.v_proj.weight"].T).view(-1, kvh, hd)

            kc, vc = kv(ctx, pos_ctx)
            kb, vb = kv(h, pos_blk)
            out = attend(
                rope(q, pos_blk, theta),
                torch.cat([kc, kb]),
                torch.cat([vc, vb]),
                torch.ones(block.shape[0], c - 1 + block.shape[0], dtype=torch.bool),
            )
            x = x + out @ sd[p + "self_attn.o_proj.weight"].T
            x = x + mlp(rms(x, sd[p + "post_attention_layernorm.weight"], eps), sd, p + "mlp.")
        out = rms(x, sd["norm.weight"], eps)
        logits = target.get_output_embeddings()(out[1 + given.shape[0] :].to(target.dtype))
    if "d2t" in sd:
        ids = torch.arange(sd["d2t"].shape[0]) + sd["d2t"].long()
        return ids[logits[:, ids].argmax(-1)]
    return logits.argmax(-1)


# -- EAGLE-3 -------------------------------------------------------------------------------------


def write_eagle3_checkpoint(
    directory: Path,
    hidden: int,
    vocab: int,
    draft_vocab: int,
    heads: int = 4,
    kv_heads: int = 2,
    inter: int = 64,
    seed: int = 0,
    layer_ids: list[int] | None = None,
    with_embeddings: bool = False,
) -> Path:
    """A random EAGLE-3 checkpoint in the EAGLE / SpecForge layout; its draft vocabulary is every
    other target id (``d2t`` non-zero)."""
    g = torch.Generator().manual_seed(seed)
    hd = hidden // heads
    sd = {
        "midlayer.self_attn.q_proj.weight": torch.randn(heads * hd, 2 * hidden, generator=g) * 0.2,
        "midlayer.self_attn.k_proj.weight": torch.randn(kv_heads * hd, 2 * hidden, generator=g) * 0.2,
        "midlayer.self_attn.v_proj.weight": torch.randn(kv_heads * hd, 2 * hidden, generator=g) * 0.2,
        "midlayer.self_attn.o_proj.weight": torch.randn(hidden, heads * hd, generator=g) * 0.2,
        "midlayer.mlp.gate_proj.weight": torch.randn(inter, hidden, generator=g) * 0.2,
        "midlayer.mlp.up_proj.weight": torch.randn(inter, hidden, generator=g) * 0.2,
        "midlayer.mlp.down_proj.weight": torch.randn(hidden, inter, generator=g) * 0.2,
        "midlayer.hidden_norm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
        "midlayer.input_layernorm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
        "midlayer.post_attention_layernorm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
        "fc.weight": torch.randn(hidden, 3 * hidden, generator=g) * 0.1,
        "norm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
        "lm_head.weight": torch.randn(draft_vocab, hidden, generator=g),
    }
    targets = torch.arange(0, 2 * draft_vocab, 2)[:draft_vocab].clamp(max=vocab - 1)
    sd["d2t"] = targets - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[targets] = True
    sd["t2d"] = t2d
    if with_embeddings:
        sd["embed_tokens.weight"] = torch.randn(vocab, hidden, generator=g)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(directory / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
    }
    if layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layer_ids}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def eagle3_reference(directory: Path, target, committed: torch.Tensor, k: int, layer_ids: list[int]) -> torch.Tensor:
    """The k tokens EAGLE-3 drafts (a chain, greedy) after ``committed`` ((c,) int64, c >= 2),
    recomputing everything without a cache at every token. Returns (k,) int64 target ids."""
    from safetensors.torch import load_file

    cfg = json.loads((directory / "config.json").read_text())
    sd = {
        k_: (v.float() if v.is_floating_point() else v)
        for k_, v in load_file(str(directory / "model.safetensors")).items()
    }
    heads, kvh, eps, theta = (
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["rms_norm_eps"],
        cfg["rope_theta"],
    )
    hidden = cfg["hidden_size"]
    hd = hidden // heads
    embed = target.get_input_embeddings()
    with torch.no_grad():
        hs = target(input_ids=committed[None, :-1], output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i][0] for i in layer_ids], -1).float() @ sd["fc.weight"].T  # (c - 1, H)
        tokens = committed[1:].clone()  # pair i: feature i with token i + 1
        hidden_in = list(feats)
        drafted = []
        for _ in range(k):
            n = tokens.shape[0]
            e = rms(embed(tokens).float(), sd["midlayer.input_layernorm.weight"], eps)
            hcur = torch.stack(hidden_in)
            x = torch.cat([e, rms(hcur, sd["midlayer.hidden_norm.weight"], eps)], -1)
            pos = torch.arange(n)
            q = rope((x @ sd["midlayer.self_attn.q_proj.weight"].T).view(n, heads, hd), pos, theta)
            kk = rope((x @ sd["midlayer.self_attn.k_proj.weight"].T).view(n, kvh, hd), pos, theta)
            vv = (x @ sd["midlayer.self_attn.v_proj.weight"].T).view(n, kvh, hd)
            out = (
                hcur
                + attend(q, kk, vv, torch.ones(n, n, dtype=torch.bool).tril())
                @ sd["midlayer.self_attn.o_proj.weight"].T
            )
            out = out + mlp(rms(out, sd["midlayer.post_attention_layernorm.weight"], eps), sd, "midlayer.mlp.")
            logits = rms(out[-1], sd["norm.weight"], eps) @ sd["lm_head.weight"].T
            d = int(logits.argmax())
            tok = d + int(sd["d2t"][d])
            drafted.append(tok)
            tokens = torch.cat([tokens, torch.tensor([tok])])
            hidden_in.append(out[-1])  # the drafter's own output is the next position's feature
    return torch.tensor(drafted)
