"""Train a DFlash or EAGLE-3 drafter for YOUR target: a local Hugging Face causal LM and a prompt file.

    python -m specpolicy.family.train_drafter dflash --target /models/Qwen2.5-7B-Instruct \\
        --prompts my_prompts.jsonl --out /models/qwen7b-dflash
    python -m specpolicy drafter=dflash drafter.model=/models/qwen7b-dflash verifier.model=/models/Qwen2.5-7B-Instruct

Three steps, each resumable (a step whose output exists in ``--work`` is skipped):

1. **Continuations**: the target's own greedy answers to the prompts (its chat template applied),
   so the drafter learns what the target will say (``--max-new-tokens`` each);
2. **Features**: the target's hidden states over prompt + answer, computed once and stored
   (``specpolicy.family.feature_store``; ~2 bytes x hidden size x feature layers per token);
3. **Training**: DFlash blocks (``specpolicy.family.train_dflash``) or EAGLE-3 with training-time
   test (``specpolicy.family.train_eagle3``); the target's embeddings and LM head stay frozen and
   are not stored. The output is a checkpoint in the official layout (``config.json`` +
   ``model.safetensors``, loadable by ``drafter=dflash`` / ``drafter=eagle3`` and by the official
   code and the engines), with ``training_log.json`` (loss and held-out validation curves).

Runs on CUDA when present (``--device auto``), else on the CPU, in bfloat16 autocast where the
device runs it natively (float32 elsewhere). A long run can save its drafter as it goes
(``--checkpoint-every``, to ``<out>.checkpoint``) and a later run can continue any checkpoint of
the same kind (``--init``: its shape, feature layers, block size and draft vocabulary). Every
option is checked before the target loads; a bad one is one line naming it, its value and what
it takes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

KINDS = ("dflash", "eagle3", "dart", "falcon")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m specpolicy.family.train_drafter",
        description="Train a DFlash or EAGLE-3 drafter for a local Hugging Face target.",
    )
    ap.add_argument("drafter", choices=KINDS, help="which drafter to train")
    ap.add_argument("--target", required=True, help="local Hugging Face model directory of the target")
    ap.add_argument(
        "--prompts", required=True, help="JSONL prompt file (a 'prompt', 'question', 'problem' or 'text' field per row)"
    )
    ap.add_argument("--out", required=True, help="output checkpoint directory (official layout)")
    ap.add_argument("--work", default=None, help="continuations and features (default: <out>.work)")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:1, ...")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=256, help="tokens of each greedy continuation")
    ap.add_argument("--max-len", type=int, default=2048, help="longest prompt + continuation kept (tokens)")
    ap.add_argument("--generate-batch", type=int, default=32, help="prompts per generation batch")
    ap.add_argument("--holdout", type=int, default=50, help="continuations held out for the validation curve")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--batch-tokens", type=int, default=8192, help="padded sequence tokens per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument(
        "--draft-layers",
        type=int,
        default=None,
        help="decoder layers (dflash: 5 by default, the released drafters' depth; eagle3: 1)",
    )
    ap.add_argument("--block-size", type=int, default=None, help="dflash: B, tokens per block (default 16)")
    ap.add_argument(
        "--layer-ids",
        type=int,
        nargs="+",
        default=None,
        help="feature layers: dflash target_layer_ids (default evenly spaced over [1, L-3]); "
        "eagle3 aux layer ids (default [2, L//2, L-3])",
    )
    ap.add_argument(
        "--mask-token-id",
        type=int,
        default=None,
        help="dflash: the mask token (default: the tokenizer's mask token, else the first embedding row no token uses)",
    )
    ap.add_argument("--anchors", type=int, default=16, help="dflash: training blocks per sequence and step")
    ap.add_argument(
        "--draft-vocab",
        type=int,
        default=None,
        help="draft vocabulary size, at most the target's vocabulary: eagle3 32000 (or the whole "
        "vocabulary) by default; dflash none by default (the official layout), else a pass runs "
        "only the LM-head rows of the answers' N most frequent tokens (and the stop token): "
        "no other token can be drafted",
    )
    ap.add_argument("--ttt", type=int, default=7, help="eagle3: training-time-test unroll steps")
    ap.add_argument(
        "--init",
        default=None,
        help="continue training this checkpoint of the same kind (a local directory): its shape, feature "
        "layers (an EAGLE-3 checkpoint's explicit ids read as layer inputs), block size, mask token "
        "and draft vocabulary, so the options that set those are refused beside it (but dflash "
        "--draft-vocab, which is derived after training)",
    )
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="save the drafter to <out>.checkpoint at the first progress line (every 10 optimizer steps) "
        "N or more steps after the last save (0 = never); a dflash --draft-vocab is added to the "
        "final checkpoint only",
    )
    return ap


#: the options that set a drafter's shape, refused beside ``--init`` (the checkpoint has its own); a
#: DFlash draft vocabulary is derived after training, so ``--draft-vocab`` stays open to dflash
SHAPE_OPTIONS = ("draft_layers", "block_size", "layer_ids", "mask_token_id", "draft_vocab")


def check_args(a: argparse.Namespace) -> dict:
    """One-line errors before anything loads; returns the target's config.json.

    Raises:
        SystemExit: naming the option, its value and what it takes.
    """
    target = Path(a.target).expanduser()
    if not (target / "config.json").is_file():
        raise SystemExit(f"error: --target={a.target!r} is not a local Hugging Face model directory (no config.json)")
    if not Path(a.prompts).expanduser().is_file():
        raise SystemExit(f"error: --prompts={a.prompts!r}: no such file")
    for name in (
        "max_new_tokens",
        "epochs",
        "batch_tokens",
        "block_size",
        "anchors",
        "draft_vocab",
        "ttt",
        "generate_batch",
        "max_len",
    ):
        v = getattr(a, name)
        if v is None:  # --draft-vocab left to the drafter's default
            continue
        if v < 1 or (name == "block_size" and v < 2):
            raise SystemExit(
                f"error: --{name.replace('_', '-')}={v}; it must be an integer >= {2 if name == 'block_size' else 1}"
            )
    for name in ("holdout", "warmup", "checkpoint_every"):
        if getattr(a, name) < 0:
            raise SystemExit(f"error: --{name.replace('_', '-')}={getattr(a, name)}; it must be an integer >= 0")
    if not a.lr > 0:
        raise SystemExit(f"error: --lr={a.lr}; it must be > 0")
    if a.draft_layers is not None and a.draft_layers < 1:
        raise SystemExit(f"error: --draft-layers={a.draft_layers}; it must be an integer >= 1")
    if a.drafter == "falcon" and a.layer_ids is not None:
        raise SystemExit(f"error: --layer-ids {a.layer_ids}: Falcon reads the target's last hidden state only")
    if a.drafter in ("eagle3", "dart") and a.draft_layers not in (None, 1):
        head = "an EAGLE-3" if a.drafter == "eagle3" else "a DART"
        raise SystemExit(f"error: --draft-layers={a.draft_layers}; {head} head has 1 layer")
    config = json.loads((target / "config.json").read_text(encoding="utf-8"))
    config = config.get("text_config", config)
    layers = int(config.get("num_hidden_layers", 0))
    ids = a.layer_ids or []
    top = layers - 1 if a.drafter == "dflash" else layers  # dflash: output of layer i; eagle3: input of layer i
    bad = [i for i in ids if not 0 <= i <= top]
    if bad:
        raise SystemExit(f"error: --layer-ids {ids}: the target has {layers} layers (ids 0..{top})")
    if a.drafter in ("eagle3", "dart") and a.layer_ids is not None and len(ids) != 3:
        raise SystemExit(
            f"error: --layer-ids {ids}: {'EAGLE-3' if a.drafter == 'eagle3' else 'DART'} fuses exactly three layers"
        )
    if a.drafter == "dart" and a.layer_ids is not None:
        raise SystemExit(f"error: --layer-ids {ids}: the DART head reads the default layers [2, L//2, L-3]")
    vocab = int(config.get("vocab_size", 0))
    if a.draft_vocab is not None and vocab and a.draft_vocab > vocab:
        raise SystemExit(
            f"error: --draft-vocab={a.draft_vocab}; it must be at most the target's vocabulary size ({vocab})"
        )
    if a.init is not None:
        check_init(a, config)
    if a.device != "auto":
        try:
            dev = torch.device(a.device)
        except RuntimeError as exc:
            raise SystemExit(f"error: --device={a.device!r} is not a torch device ({exc})") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise SystemExit(f"error: --device={a.device!r} but CUDA is not available here; use cpu or auto")
    return config


def check_init(a: argparse.Namespace, target_config: dict) -> None:
    """``--init``: a local checkpoint of ``a.drafter``'s kind, with weights, that fits the target,
    and none of ``SHAPE_OPTIONS`` beside it (a dflash ``--draft-vocab`` excepted). Sets ``a.init``
    to the directory with ``~`` expanded.

    Raises:
        SystemExit: one line naming the option and what is wrong.
    """
    from specpolicy.core.errors import ConfigError
    from specpolicy.models import dart, dflash, eagle3, falcon
    from specpolicy.models.checkpoint import read_config, weight_files

    shape = [n for n in SHAPE_OPTIONS if not (n == "draft_vocab" and a.drafter == "dflash")]
    given = [f"--{n.replace('_', '-')}" for n in shape if getattr(a, n) is not None]
    if given:
        raise SystemExit(f"error: --init={a.init!r} continues a checkpoint with its own shape; drop {', '.join(given)}")
    key = f"--init={a.init!r}"
    directory = Path(a.init).expanduser()
    try:
        raw = read_config(directory, key)
        architectures = raw.get("architectures") or []
        kind = (
            "dflash"
            if dflash.ARCHITECTURE in architectures or "dflash_config" in raw
            else "eagle3"
            if eagle3.ARCHITECTURE in architectures
            else "dart"
            if dart.ARCHITECTURE in architectures
            else "falcon"
            if falcon.ARCHITECTURE in architectures
            else None
        )  # None: say nothing yet
        if kind not in (None, a.drafter):
            names = {"dflash": "DFlash", "eagle3": "EAGLE-3", "dart": "DART", "falcon": "Falcon"}
            raise ConfigError(
                f"{key}: the checkpoint is {names[kind]} (architectures {architectures}), not {names[a.drafter]}"
            )
        if not weight_files(directory):
            raise ConfigError(f"{key} has no weights (no *.safetensors nor pytorch_model*.bin)")
        if a.drafter == "dflash":
            from specpolicy.drafters.dflash import check_fits_target
        elif a.drafter == "dart":
            from specpolicy.drafters.dart import check_fits_target
        elif a.drafter == "falcon":
            from specpolicy.models.falcon import check_fits_target
        else:
            from specpolicy.drafters.eagle3 import check_fits_target
        check_fits_target(raw, target_config, key)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:  # a config of another kind
        raise SystemExit(f"error: {key} is not a {a.drafter} checkpoint ({exc!r} in its config.json)") from None
    a.init = str(directory)


def attention_fields(target_config: dict) -> dict[str, int]:
    """A draft head's attention shape, the target's (its ``config.json`` as a dict): query heads,
    key/value heads (default: as many) and the head width (default: hidden size / heads)."""
    heads = int(target_config["num_attention_heads"])
    return {
        "num_attention_heads": heads,
        "num_key_value_heads": int(target_config.get("num_key_value_heads", heads)),
        "head_dim": int(target_config.get("head_dim") or target_config["hidden_size"] // heads),
    }


def mask_token(tokenizer, vocab_size: int, given: int | None) -> int:
    """The DFlash mask token: ``given``, else the tokenizer's mask token, else the first embedding
    row past the tokenizer's vocabulary (Qwen-style padded embeddings leave such rows unused).

    Raises:
        SystemExit: when there is none (name one with --mask-token-id).
    """
    if given is not None:
        if not 0 <= given < vocab_size:
            raise SystemExit(f"error: --mask-token-id={given} is outside the target's vocabulary (0..{vocab_size - 1})")
        return given
    if getattr(tokenizer, "mask_token_id", None) is not None:
        return int(tokenizer.mask_token_id)
    if len(tokenizer) < vocab_size:
        return len(tokenizer)
    raise SystemExit(
        "error: the target's tokenizer has no mask token and no unused embedding row; pass "
        "--mask-token-id with a token id the target never produces"
    )


def run(a: argparse.Namespace) -> dict:
    """The three steps (module docstring); returns the training log written beside the checkpoint."""
    from transformers import AutoTokenizer

    from specpolicy.family.feature_store import FeatureStore
    from specpolicy.family.trainer import TrainConfig

    target_config = check_args(a)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    torch.manual_seed(a.seed)
    out, work = Path(a.out), Path(a.work or f"{a.out}.work")
    work.mkdir(parents=True, exist_ok=True)
    log: dict = {"args": vars(a), "device": device, "torch": torch.__version__, "started": time.ctime()}
    tokenizer = AutoTokenizer.from_pretrained(a.target)
    examples = _continuations(a, tokenizer, work, device, log)
    ids, feature_layers = _feature_layers(a, target_config)
    _features(a, examples, feature_layers, work / "features", device, log)
    store = FeatureStore(work / "features")
    train_idx = list(range(len(examples) - a.holdout))
    held = list(range(len(examples) - a.holdout, len(examples)))
    cfg = TrainConfig(
        epochs=a.epochs,
        max_steps=a.max_steps,
        batch_tokens=a.batch_tokens,
        lr=a.lr,
        warmup_steps=a.warmup,
        seed=a.seed,
        log_every=10,
        device=device,
    )  # bf16 where it pays
    print(f"== {a.drafter}: {len(train_idx)} continuations, {len(held)} held out, on {device}", flush=True)
    train = {"dflash": _train_dflash, "dart": _train_dart, "falcon": _train_falcon}.get(a.drafter, _train_eagle3)
    log[a.drafter] = train(a, target_config, tokenizer, examples, store, cfg, ids, (train_idx, held))
    (out / "training_log.json").write_text(json.dumps(log, indent=1), encoding="utf-8")
    print(
        f"== done: {out} (python -m specpolicy drafter={a.drafter} drafter.model={out} verifier.model={a.target})",
        flush=True,
    )
    return log


def _continuations(a: argparse.Namespace, tokenizer, work: Path, device: str, log: dict) -> list:
    """Step 1: the target's greedy continuations of ``--prompts`` (``<work>/continuations.jsonl``,
    generated once), fitted to ``--max-len``; their counts go into ``log``.

    Raises:
        SystemExit: when no more than ``--holdout`` continuations fit.
    """
    from specpolicy.data.datasets import load_prompts
    from specpolicy.family.data import Example, fit_length, read_examples, save_examples
    from specpolicy.family.distill import greedy_generate
    from specpolicy.family.models import load_model
    from specpolicy.family.trainer import bf16_autocast_pays

    data = work / "continuations.jsonl"
    if not data.exists():
        prompts = [p.token_ids(tokenizer).tolist() for p in load_prompts("prompts", a.prompts)]
        print(f"== continuations: {len(prompts)} prompts x {a.max_new_tokens} tokens on {device}", flush=True)
        model = load_model(a.target).to(device)
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        t0 = time.time()
        outs = greedy_generate(
            model, prompts, eos, pad, a.max_new_tokens, a.generate_batch, bf16=bf16_autocast_pays(device), log_every=5
        )
        save_examples([Example(tuple(p), tuple(o)) for p, o in zip(prompts, outs)], data)
        log["continuations"] = {"n": len(prompts), "wall_s": round(time.time() - t0, 1)}
        del model
    examples, fit = fit_length(read_examples(data), a.max_len, "drop")
    if len(examples) <= a.holdout:
        raise SystemExit(
            f"error: {len(examples)} continuations fit --max-len={a.max_len}, not more than "
            f"--holdout={a.holdout}; give more prompts or a smaller --holdout"
        )
    log["data"] = fit
    return examples


def _feature_layers(a: argparse.Namespace, target_config: dict) -> tuple[list[int] | None, list[int]]:
    """The drafter's target layer ids (DFlash, EAGLE-3; None for the others) and the
    ``hidden_states`` indices the feature store keeps: an ``--init`` checkpoint's own, else the
    drafter's defaults for this target."""
    from specpolicy.models.dflash import default_target_layer_ids

    layers = int(target_config["num_hidden_layers"])
    if a.init is not None:  # the checkpoint's feature layers (check_init: it fits the target)
        from specpolicy.models.checkpoint import read_config

        raw = read_config(Path(a.init).expanduser(), "--init")
        if a.drafter == "dflash":
            from specpolicy.models.dflash import DFlashSpec

            ids = list(DFlashSpec.from_config(raw, "--init").target_layer_ids)
            return ids, [i + 1 for i in ids]
        if a.drafter == "dart":  # its three layers and the last hidden state (the loss's target distribution)
            from specpolicy.drafters.dart import check_fits_target

            return None, [*check_fits_target(raw, target_config, "--init"), layers]
        if a.drafter == "falcon":
            return None, [layers]
        from specpolicy.drafters.eagle3 import check_fits_target

        return None, list(check_fits_target(raw, target_config, "--init"))
    if a.drafter == "dflash":
        ids = a.layer_ids or default_target_layer_ids(layers, a.draft_layers or 5)
        return ids, [i + 1 for i in ids]
    if a.drafter == "dart":
        return None, [2, layers // 2, layers - 3, layers]
    if a.drafter == "falcon":  # the top layer, as the LM head reads it (the head's own width)
        return None, [layers]
    ids = a.layer_ids
    return ids, ids or [2, layers // 2, layers - 3]


def _features(a: argparse.Namespace, examples: list, feature_layers: list[int], store_dir: Path, device, log) -> None:
    """Step 2: the target's hidden states ``feature_layers`` of every continuation in ``store_dir``,
    kept when the store already holds them for the same target and continuations."""
    from specpolicy.family.feature_store import extract_features

    store_meta = store_dir / "store.json"
    meta = json.loads(store_meta.read_text()) if store_meta.exists() else None
    reusable = (
        meta is not None
        and set(feature_layers) <= set(meta["layers"])
        and meta.get("target") == str(a.target)
        and meta["lengths"] == [len(e) for e in examples]
    )  # the same target and continuations
    if not reusable:
        print(f"== features: hidden_states {feature_layers} on {device}", flush=True)
        log["features"] = extract_features(a.target, examples, feature_layers, store_dir, device=device)


def _pad_and_stops(tokenizer) -> tuple[int, tuple[int, ...]]:
    """The padding id (the EOS when the tokenizer has none) and the stop ids (the EOS)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return pad, () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)


def _train_dflash(a, target_config, tokenizer, examples, store, cfg, ids, split) -> dict:
    """Step 3 for DFlash (and its draft vocabulary with ``--draft-vocab``); returns its stats."""
    from specpolicy.family.train_dflash import DFLASH_SIZE, train_dflash

    pad, stops = _pad_and_stops(tokenizer)
    vocab = int(target_config["vocab_size"])
    size = mask = None
    if a.init is None:
        size = {
            **DFLASH_SIZE,
            "num_hidden_layers": a.draft_layers or 5,
            **attention_fields(target_config),
            "intermediate_size": int(target_config["intermediate_size"]),
        }
        mask = mask_token(tokenizer, vocab, a.mask_token_id)
    train_idx, held = split
    stats = train_dflash(
        a.target,
        examples,
        store,
        cfg,
        Path(a.out),
        pad,
        mask,
        a.block_size or 16,
        tuple(ids),
        a.anchors,
        size=size,
        init=a.init,
        train_indices=train_idx,
        heldout_indices=held,
        checkpoint_every=a.checkpoint_every,
    )
    if a.draft_vocab is not None:
        from specpolicy.family.train_dflash import add_draft_vocabulary

        stats.update(add_draft_vocabulary(Path(a.out), [examples[i] for i in train_idx], a.draft_vocab, stops))
    return stats


def _train_dart(a, target_config, tokenizer, examples, store, cfg, ids, split) -> dict:
    """Step 3 for DART; returns its stats."""
    from specpolicy.family.train_dart import DART_SIZE, train_dart

    pad, stops = _pad_and_stops(tokenizer)
    return train_dart(
        a.target,
        examples,
        store,
        cfg,
        Path(a.out),
        pad,
        a.draft_vocab or 32000,
        size={
            **DART_SIZE,
            **attention_fields(target_config),
            "intermediate_size": int(target_config["intermediate_size"]),
        },
        train_indices=split[0],
        heldout_indices=split[1],
        init=a.init,
        checkpoint_every=a.checkpoint_every,
        stop_ids=stops,
    )


def _train_falcon(a, target_config, tokenizer, examples, store, cfg, ids, split) -> dict:
    """Step 3 for Falcon; returns its stats."""
    from specpolicy.family.train_falcon import FALCON_SIZE, train_falcon

    pad, _ = _pad_and_stops(tokenizer)
    return train_falcon(
        a.target,
        examples,
        store,
        cfg,
        Path(a.out),
        pad,
        size={
            **FALCON_SIZE,
            "num_hidden_layers": a.draft_layers or 1,
            **attention_fields(target_config),
        },
        train_indices=split[0],
        heldout_indices=split[1],
        init=a.init,
        checkpoint_every=a.checkpoint_every,
    )


def _train_eagle3(a, target_config, tokenizer, examples, store, cfg, ids, split) -> dict:
    """Step 3 for EAGLE-3; returns its stats."""
    from specpolicy.family.train_eagle3 import EAGLE3_SIZE, train_eagle3

    pad, _ = _pad_and_stops(tokenizer)
    size = {
        **EAGLE3_SIZE,
        **attention_fields(target_config),
        "intermediate_size": int(target_config["intermediate_size"]),
    }
    return train_eagle3(
        a.target,
        examples,
        store,
        cfg,
        Path(a.out),
        pad,
        a.draft_vocab or 32000,
        a.ttt,
        layer_ids=ids,
        size=size,
        train_indices=split[0],
        heldout_indices=split[1],
        init=a.init,
        checkpoint_every=a.checkpoint_every,
    )


#: The kind that trains SpecDec++'s acceptance head for an existing drafter
#: (``specpolicy.family.train_acceptance_head``): ``acceptance-head --drafter NAME ...`` or ``--kind acceptance-head``.
ACCEPTANCE_HEAD = "acceptance-head"


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point; ``acceptance-head`` (first argument, or ``--kind acceptance-head``) trains
    SpecDec++'s acceptance head for a drafter (``specpolicy.family.train_acceptance_head``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if (
        args[:1] == [ACCEPTANCE_HEAD]
        or args[:2] == ["--kind", ACCEPTANCE_HEAD]
        or f"--kind={ACCEPTANCE_HEAD}" in args[:1]
    ):
        from specpolicy.family.train_acceptance_head import main as train_head

        return train_head(args[2:] if args[0] == "--kind" else args[1:])
    return run(build_parser().parse_args(args))


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
