"""Random DART, Falcon and DEER checkpoints that fit the tiny on-disk family's target (``conftest.family``),
for the tests that run these drafters through a benchmark or the diagnostics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def save_tiny_other_drafters(family: dict[str, Path], directory: Path) -> dict[str, Path]:
    """Random DART, Falcon and DEER checkpoints that fit the tiny family's target: DART in the
    released layout (EAGLE-3's tensors over ``hidden_states[0, 1, 2]`` + ``mask_rep``, d = 8), a
    Falcon head (k = 2) as ``train_falcon`` makes one, and DEER as full weights (the tiny dLLM
    drafter with block 32)."""
    from transformers import AutoConfig

    from conditioned_reference import write_eagle3_checkpoint
    from specpolicy.family.train_falcon import new_falcon
    from specpolicy.models.falcon import save_falcon

    target = AutoConfig.from_pretrained(family["target"])
    vocab, hidden = int(target.vocab_size), int(target.hidden_size)
    dart = write_eagle3_checkpoint(directory / "dart", hidden, vocab, vocab // 2, seed=5, layer_ids=[0, 1, 2])
    sd = load_file(str(dart / "model.safetensors"))
    sd["midlayer.mask_rep"] = torch.randn(2 * hidden, generator=torch.Generator().manual_seed(6))
    save_file(sd, str(dart / "model.safetensors"))
    config = json.loads((dart / "config.json").read_text())
    (dart / "config.json").write_text(
        json.dumps({**config, "architectures": ["LlamaForCausalLMDart"], "draft_length": 7})
    )
    size = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64)
    falcon = save_falcon(new_falcon(target, 7, size=size), directory / "falcon")
    deer = Path(shutil.copytree(family["drafter"], directory / "deer"))
    config = json.loads((deer / "config.json").read_text())
    mask = json.loads((deer / "tokenizer.json").read_text())["added_tokens"]
    mask_id = next(t["id"] for t in mask if t["content"] == "|<MASK>|")
    (deer / "config.json").write_text(json.dumps({**config, "bd_block_size": 32, "mask_token_id": mask_id}))
    (deer / "deer.json").write_text(json.dumps({"block_size": 32, "mask_token_id": mask_id, "vocab_size": vocab}))
    return {"dart": dart, "falcon": falcon, "deer": deer}
