"""The family training pipeline: tokenizer -> target -> distill -> ar-drafter -> dllm-drafter -> features ->
dflash-drafter -> dflash-vocabulary -> eagle3-drafter -> eval.

Usage::

    OMP_NUM_THREADS=2 python -m specpolicy.family \\
        --data /work/shared/data/gsm8k/train.jsonl --out specpolicy/family/bundle

Each stage is skipped when its output already exists (``--force`` redoes every stage,
``--redo STAGE ...`` only the named ones). Budgets are epochs / steps by default, so a run with
the same options and seed is reproducible; ``--max-seconds-per-stage`` adds a wall-clock budget per
training stage (``trainer.TrainConfig.max_seconds``: the steps run depend on the machine, and each
stage's log entry says ``steps`` to rerun it with). ``--device cuda`` (or ``auto``) runs distill,
the features and the training stages on a CUDA device (``benchmarks/gpu_train.sh``).

Outputs under ``--out`` (the bundle: weights and the log only) and ``--work`` (what is not bundled;
:func:`default_work_dir`):

* ``tokenizer/``: the tokenizer alone;
* ``target/``, ``ar-drafter/``, ``dllm-drafter/``: ``save_pretrained`` dirs (bf16 weights,
  config, generation config, tokenizer);
* ``<work>/distill/target_greedy.jsonl``: the distilled training data (token ids);
* ``<work>/features/``: the target's hidden states over the distilled data (``feature_store``;
  GBs), read by the ``dflash-drafter`` and ``eagle3-drafter`` stages;
* ``dflash-drafter/``, ``eagle3-drafter/``: the drafters conditioned on the target, in the official
  DFlash / EAGLE-3 checkpoint layouts (no embeddings or LM head: the target's are used); the
  ``dflash-vocabulary`` stage gives the DFlash drafter a draft vocabulary (its passes run the
  LM-head rows of the distilled responses' most frequent tokens only; seconds, no training);
* ``training_log.json``: per-stage stats (losses, steps, wall time, params) and eval numbers.
"""

from __future__ import annotations

import argparse
import os
import shlex
import time
from pathlib import Path

import torch

STAGES = [
    "tokenizer",
    "target",
    "distill",
    "ar-drafter",
    "dllm-drafter",
    "deer-drafter",
    "features",
    "dflash-drafter",
    "dflash-vocabulary",
    "eagle3-drafter",
    "dart-drafter",
    "falcon-drafter",
    "eval",
]


def _at_least_one(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: it must be an integer >= 1")
    return value


def default_work_dir(out: Path) -> Path:
    """Where the pipeline keeps what it does not bundle (``distill/``, ``features/``: GBs):
    ``<out>.work``, or ``./family-work`` when ``out`` lies inside the specpolicy package, whose
    assets hold the bundled weights only (``<out>.work`` would land beside them)."""
    package = Path(__file__).resolve().parents[1]
    if out.resolve().is_relative_to(package):
        return Path("family-work")
    return out.with_name(out.name + ".work")


def build_parser() -> argparse.ArgumentParser:
    """The family pipeline's options (``python -m specpolicy.family --help``), section by section."""
    ap = argparse.ArgumentParser(prog="python -m specpolicy.family", description=__doc__.split("\n")[0])
    for add in (_run_options, _target_options, _dllm_options, _feature_drafter_options, _other_drafter_options):
        add(ap)
    return ap


def _run_options(ap: argparse.ArgumentParser) -> None:
    """Where and how the pipeline runs: data, output, stages, device, precision."""
    ap.add_argument("--data", default="/work/shared/data/gsm8k/train.jsonl", help="GSM8K train jsonl")
    ap.add_argument("--test-data", default="/work/shared/data/gsm8k/test.jsonl", help="GSM8K test jsonl (eval)")
    ap.add_argument("--out", default="specpolicy/family/bundle", help="output dir")
    ap.add_argument(
        "--work",
        default=None,
        help="distill/ and features/, not bundled (default: <out>.work, or ./family-work when "
        "--out lies inside the specpolicy package)",
    )
    ap.add_argument("--force", action="store_true", help="redo every stage even if its output exists")
    ap.add_argument("--redo", nargs="*", default=[], choices=STAGES, help="redo these stages")
    ap.add_argument("--stages", nargs="*", default=STAGES, choices=STAGES, help="stages to run (default all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: OMP_NUM_THREADS or 2)")
    ap.add_argument("--limit-rows", type=int, default=None, help="use only the first N train rows (smoke runs)")
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda", "auto"],
        default="cpu",
        help="where distill, features and every training stage run (auto: cuda when available, else cpu)",
    )
    ap.add_argument(
        "--max-seconds-per-stage",
        type=float,
        default=None,
        help="wall-clock budget of each training stage's loop (trainer.TrainConfig.max_seconds: the step plan "
        "is cut to what fits after 20 timed steps, the LR schedule recomputed; deer-drafter splits it "
        "between its two stages in proportion to their step counts). Default: none, budgets in steps only",
    )
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--max-len", type=int, default=384, help="max prompt+response tokens")
    ap.add_argument("--overflow", choices=["drop", "truncate"], default="drop")
    precision = ap.add_mutually_exclusive_group()
    precision.add_argument(
        "--bf16",
        dest="bf16",
        action="store_const",
        const=True,
        default=None,
        help="train and distill under bf16 autocast (default: where the CPU has native bf16 "
        "arithmetic, AVX512-BF16 or AMX; float32 elsewhere, where bf16 is emulated and slower)",
    )
    precision.add_argument("--no-bf16", dest="bf16", action="store_const", const=False, help="train in float32")


def _target_options(ap: argparse.ArgumentParser) -> None:
    """The target, its distillation and the AR drafter."""
    ap.add_argument("--target-size", default="target")
    ap.add_argument("--target-epochs", type=int, default=4)
    ap.add_argument("--target-max-steps", type=int, default=None)
    ap.add_argument("--target-batch-tokens", type=int, default=8192)
    ap.add_argument("--target-lr", type=float, default=1.5e-3)
    ap.add_argument("--target-warmup", type=int, default=100)
    # distillation
    ap.add_argument("--distill-prompts", type=int, default=0, help="number of train prompts (0 = all)")
    ap.add_argument("--distill-batch", type=int, default=128)
    ap.add_argument("--distill-max-new", type=int, default=256)
    ap.add_argument(
        "--distill-fp32",
        action="store_true",
        help="decode in fp32 (default: as --bf16 / --no-bf16 say, else bf16 autocast where the CPU has "
        "native bf16 arithmetic, ~3x faster there, and fp32 elsewhere)",
    )
    ap.add_argument(
        "--distill-top-k",
        type=int,
        default=8,
        help="also keep the target's top-k next-token log-probs (soft targets of the dLLM drafter; 0 = none)",
    )
    # AR drafter
    ap.add_argument("--drafter-size", default="ar-drafter")
    ap.add_argument("--drafter-epochs", type=int, default=8)
    ap.add_argument("--drafter-max-steps", type=int, default=None)
    ap.add_argument("--drafter-batch-tokens", type=int, default=8192)
    ap.add_argument("--drafter-lr", type=float, default=2e-3)
    ap.add_argument("--drafter-warmup", type=int, default=50)


def _dllm_options(ap: argparse.ArgumentParser) -> None:
    """The dLLM drafter: its diffusion phase and the phase matched to one-pass drafting."""
    ap.add_argument("--dllm-epochs", type=int, default=2)
    ap.add_argument("--dllm-max-steps", type=int, default=None)
    ap.add_argument(
        "--dllm-batch-tokens",
        type=int,
        default=4096,
        help="padded sequence tokens per batch (compute is ~4x: two noisy copies x [noisy;clean])",
    )
    ap.add_argument("--dllm-lr", type=float, default=1e-3)
    ap.add_argument("--dllm-warmup", type=int, default=30)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument(
        "--dllm-init",
        default=None,
        help="model dir the dLLM drafter starts from (default: <out>/ar-drafter; with --dllm-epochs 0 "
        "the matched phase starts from it, e.g. an earlier dllm-drafter)",
    )
    # dLLM drafter, phase 2: the objective matched to one-pass drafting
    ap.add_argument("--dllm-matched-epochs", type=int, default=2, help="0 = no matched phase")
    ap.add_argument("--dllm-matched-max-steps", type=int, default=None)
    ap.add_argument("--dllm-matched-batch-tokens", type=int, default=4096)
    ap.add_argument("--dllm-matched-lr", type=float, default=5e-4)
    ap.add_argument("--dllm-matched-warmup", type=int, default=20)
    ap.add_argument(
        "--suffix-prob",
        type=float,
        default=0.7,
        help="share of (sequence, block) pairs with suffix masks in the matched phase, in [0, 1]",
    )
    ap.add_argument(
        "--boundary-prob", type=float, default=0.5, help="share of suffix cuts on small-block boundaries, in [0, 1]"
    )
    ap.add_argument(
        "--calibrate-examples",
        type=int,
        default=200,
        help="fit the dLLM drafter's confidence temperature on the last N distilled examples and fold it "
        "into its weights (0 = no calibration)",
    )
    ap.add_argument(
        "--dllm-checkpoint-every",
        type=int,
        default=0,
        help="save the matched phase's model to <out>/dllm-drafter.checkpoint every N steps (0 = never)",
    )
    ap.add_argument(
        "--soft-weight",
        type=float,
        default=0.5,
        help="weight of the target's soft next-token distributions in the matched phase's loss, in [0, 1]",
    )


def _feature_drafter_options(ap: argparse.ArgumentParser) -> None:
    """Drafters conditioned on the target (DFlash, EAGLE-3), trained on stored target features."""
    ap.add_argument("--feature-batch-tokens", type=int, default=8192, help="padded tokens per target pass (features)")
    ap.add_argument(
        "--holdout",
        type=int,
        default=100,
        help="last N distilled examples held out of DFlash / EAGLE-3 training (validation curves)",
    )
    ap.add_argument("--dflash-epochs", type=int, default=6)
    ap.add_argument("--dflash-max-steps", type=int, default=None)
    ap.add_argument("--dflash-batch-tokens", type=int, default=4096, help="padded sequence tokens per batch")
    ap.add_argument("--dflash-lr", type=float, default=2e-3)
    ap.add_argument("--dflash-warmup", type=int, default=50)
    ap.add_argument("--dflash-block-size", type=int, default=16, help="B: one pass drafts B - 1 tokens")
    ap.add_argument(
        "--dflash-layer-ids",
        type=int,
        nargs="+",
        default=[2, 6, 11],
        help="DFlash target_layer_ids (id i = output of target layer i)",
    )
    ap.add_argument("--dflash-anchors", type=int, default=16, help="training blocks per sequence and step")
    ap.add_argument("--dflash-gamma", type=float, default=7.0, help="loss decay over block positions (0 = none)")
    ap.add_argument(
        "--dflash-extension-probs",
        type=float,
        nargs="+",
        default=[0.6, 0.25, 0.1, 0.05],
        help="share of training steps whose blocks carry 0, 1, 2, ... extension passes' given tokens",
    )
    ap.add_argument(
        "--dflash-init", default=None, help="a DFlash checkpoint to continue training from (default: fresh weights)"
    )
    ap.add_argument(
        "--dflash-layers",
        type=_at_least_one,
        default=None,
        help="decoder layers of a fresh DFlash drafter (default: the bundled drafter's 2; unused with --dflash-init)",
    )
    ap.add_argument(
        "--dflash-int8",
        action="store_true",
        help="store the DFlash drafter's large 2-D weights row-wise as int8 (a 4-layer drafter fits the bundle so)",
    )
    ap.add_argument(
        "--dflash-checkpoint-every",
        type=int,
        default=0,
        help="save the DFlash drafter to <out>/dflash-drafter.checkpoint every N steps (0 = never)",
    )
    ap.add_argument(
        "--dflash-draft-vocab",
        type=_at_least_one,
        default=1024,
        help="dflash-vocabulary: most frequent response tokens whose LM-head rows a DFlash pass runs",
    )
    ap.add_argument("--eagle3-epochs", type=int, default=4)
    ap.add_argument("--eagle3-max-steps", type=int, default=None)
    ap.add_argument("--eagle3-batch-tokens", type=int, default=4096)
    ap.add_argument("--eagle3-lr", type=float, default=2e-3)
    ap.add_argument("--eagle3-warmup", type=int, default=50)
    ap.add_argument("--eagle3-ttt", type=int, default=7, help="training-time-test unroll steps")
    ap.add_argument("--eagle3-draft-vocab", type=int, default=2048, help="draft vocabulary size")


def _other_drafter_options(ap: argparse.ArgumentParser) -> None:
    """DART, DEER and Falcon, then the eval stage and logging."""
    ap.add_argument("--dart-epochs", type=int, default=1)
    ap.add_argument("--dart-max-steps", type=int, default=300)
    ap.add_argument("--dart-batch-tokens", type=int, default=4096)
    ap.add_argument("--dart-lr", type=float, default=2e-3)
    ap.add_argument("--dart-warmup", type=int, default=30)
    ap.add_argument("--dart-draft-vocab", type=int, default=1024, help="DART's draft vocabulary size")
    ap.add_argument("--dart-init", default=None, help="continue training this DART checkpoint")
    ap.add_argument(
        "--deer-args",
        default="",
        help="extra options of the deer-drafter stage, one string in train_deer's syntax (later options win; "
        "write it with '=': --deer-args='--stage1-steps 600 --base dllm-drafter')",
    )
    ap.add_argument("--falcon-epochs", type=int, default=2, help="Falcon: epochs (lambda decays over them)")
    ap.add_argument("--falcon-max-steps", type=int, default=None)
    ap.add_argument("--falcon-batch-tokens", type=int, default=4096)
    ap.add_argument("--falcon-lr", type=float, default=2e-3)
    ap.add_argument("--falcon-warmup", type=int, default=50)
    ap.add_argument("--falcon-init", default=None, help="continue training this Falcon checkpoint")
    # eval
    ap.add_argument("--eval-n", type=int, default=50)
    ap.add_argument("--eval-k", type=int, default=5)
    ap.add_argument(
        "--eval-diagnostics-n",
        type=int,
        default=30,
        help="GSM8K test prompts of the dLLM drafter diagnostics in the eval stage (0 = skip)",
    )
    ap.add_argument("--log-every", type=int, default=10)


def check_args(a: argparse.Namespace) -> None:
    """One-line errors for out-of-range options (before anything loads).

    Raises:
        SystemExit: naming the option, the value and the accepted range.
    """
    for name in ("suffix_prob", "boundary_prob", "soft_weight"):
        v = getattr(a, name)
        if not 0.0 <= v <= 1.0:
            raise SystemExit(f"error: --{name.replace('_', '-')}={v}; it must be in [0, 1]")
    for name in ("dllm_epochs", "dllm_matched_epochs", "dllm_checkpoint_every", "dflash_checkpoint_every"):
        v = getattr(a, name)
        if v < 0:
            raise SystemExit(f"error: --{name.replace('_', '-')}={v}; it must be an integer >= 0")
    if a.dllm_epochs == 0 and a.dllm_matched_epochs == 0:
        raise SystemExit("error: --dllm-epochs=0 and --dllm-matched-epochs=0; at least one must be >= 1")
    if a.max_seconds_per_stage is not None and not a.max_seconds_per_stage > 0:
        raise SystemExit(f"error: --max-seconds-per-stage={a.max_seconds_per_stage}; it must be > 0 (seconds)")
    resolve_device(a.device)


def resolve_device(device: str) -> str:
    """The torch device of ``--device``: ``auto`` is ``cuda`` when ``torch.cuda.is_available()``, else ``cpu``.

    Raises:
        SystemExit: ``--device cuda`` on a machine without a usable CUDA device (one line, before anything loads).
    """
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device=cuda but torch.cuda.is_available() is False here; use --device cpu or auto")
    return device


def _dir_mb(p: Path) -> float:
    return sum(f.stat().st_size for f in p.glob("*.safetensors")) / 2**20


class _Run:
    """One pipeline run: its options, device, paths, tokenizer and the data its stages share
    (read once, when a stage first asks)."""

    def __init__(self, a: argparse.Namespace, device: str, threads: int) -> None:
        self.a, self.device, self.threads = a, device, threads
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        work = Path(a.work) if a.work else default_work_dir(self.out)
        self.log_path = self.out / "training_log.json"
        self.bf16 = a.bf16  # None: where it runs natively (trainer.bf16_autocast_pays)
        #: each stage's output: a bundled model directory of ``out``, or what ``work`` keeps
        self.paths = {stage: self.out / stage for stage in STAGES if stage not in ("distill", "features", "eval")}
        self.paths["dflash-vocabulary"] = self.out / "dflash-drafter"
        self.paths["distill"] = work / "distill" / "target_greedy.jsonl"
        self.paths["features"] = work / "features"
        self.tok = None
        self._train_examples = None
        self._drafter_data = None

    def todo(self, stage: str) -> bool:
        """Whether ``stage`` runs: asked for, and forced, redone, ``eval``, or its output missing."""
        from specpolicy.family.models import is_saved

        a = self.a
        if stage not in a.stages:
            return False
        if a.force or stage in a.redo or stage == "eval":
            return True
        p = self.paths[stage]
        if stage == "distill":
            done = p.exists()
        elif stage == "tokenizer":
            done = (p / "tokenizer.json").exists()
        elif stage == "features":
            done = (p / "store.json").exists()
        elif stage in ("dflash-drafter", "eagle3-drafter", "dart-drafter", "falcon-drafter"):
            done = (p / "model.safetensors").exists()
        elif stage == "dflash-vocabulary":
            done = "draft_vocab_size" in (p / "config.json").read_text() if (p / "config.json").exists() else False
        else:
            done = is_saved(p)
        if done:
            print(f"== {stage}: output exists ({p}), skipped (--force / --redo {stage} to redo)", flush=True)
        return not done

    def log(self, key: str, value) -> dict:
        """``training_log.json[key] = value``; returns the whole log."""
        from specpolicy.family.training_log import update_log

        return update_log(self.log_path, key, value)

    def train(self):
        """The GSM8K train examples (``--data``), read once."""
        from specpolicy.family.data import load_examples

        if self._train_examples is None:
            a = self.a
            self._train_examples, st = load_examples(a.data, self.tok, a.max_len, a.overflow, a.limit_rows)
            print(f"train data: {st}", flush=True)
            self.log("data", st)
        return self._train_examples

    def cfg(self, prefix: str, **kw):
        """The ``TrainConfig`` of the ``--<prefix>-*`` options."""
        from specpolicy.family.trainer import TrainConfig

        a = self.a
        return TrainConfig(
            epochs=getattr(a, f"{prefix}_epochs"),
            max_steps=getattr(a, f"{prefix}_max_steps"),
            batch_tokens=getattr(a, f"{prefix}_batch_tokens"),
            lr=getattr(a, f"{prefix}_lr"),
            warmup_steps=getattr(a, f"{prefix}_warmup"),
            seed=a.seed,
            bf16=self.bf16,
            log_every=a.log_every,
            device=self.device,
            max_seconds=a.max_seconds_per_stage,
            **kw,
        )

    def distilled_with_soft(self, soft):
        """The distilled examples that fit ``--max-len`` and (when given) their soft targets."""
        from specpolicy.family.data import fit_length, read_examples

        a = self.a
        exs = read_examples(self.paths["distill"])
        keep = [i for i, e in enumerate(exs) if len(e) <= a.max_len]
        if a.overflow == "truncate":  # truncation keeps every row whose prompt fits; soft rows are cut alike
            kept, _ = fit_length(exs, a.max_len, a.overflow)
            keep = [i for i, e in enumerate(exs) if len(e.prompt_ids) < a.max_len]
            return kept, None if soft is None else [soft[i] for i in keep]
        return [exs[i] for i in keep], None if soft is None else [soft[i] for i in keep]

    def distilled(self):
        """The distilled examples fitted to ``--max-len``, read once."""
        from specpolicy.family.data import fit_length, read_examples

        if self._drafter_data is None:
            exs, st = fit_length(read_examples(self.paths["distill"]), self.a.max_len, self.a.overflow)
            print(f"distilled data: {st}", flush=True)
            self._drafter_data = exs
        return self._drafter_data

    def conditioned_data(self):
        """The distilled examples as the feature store indexes them, and the training / held-out split."""
        exs, holdout = self.distilled(), self.a.holdout
        return exs, list(range(len(exs) - holdout)), list(range(len(exs) - holdout, len(exs)))


def run(a: argparse.Namespace) -> dict:
    """Run the requested stages; returns the final training log."""
    from specpolicy.family.training_log import read_log

    check_args(a)
    device = resolve_device(a.device)
    threads = a.threads or int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    r = _Run(a, device, threads)
    r.log("run", {"args": vars(a), "threads": threads, "torch": torch.__version__, "started": time.ctime()})
    for stages in (_target_stages, _dllm_stages, _deer_stage, _feature_stages, _dart_falcon_stages, _eval_stage):
        stages(r)
    paths = r.paths
    total_mb = sum(
        _dir_mb(paths[m])
        for m in ("target", "ar-drafter", "dllm-drafter", "dflash-drafter", "eagle3-drafter")
        if paths[m].exists()
    )
    log = r.log("weights_total_mb", round(total_mb, 2))
    print(f"== done; weights total {total_mb:.1f} MB; log {r.log_path}", flush=True)
    return read_log(r.log_path) if log is None else log


def _target_stages(r: _Run) -> None:
    """tokenizer, target, distill, ar-drafter (and the tokenizer every later stage reads)."""
    from specpolicy.family.distill import distill
    from specpolicy.family.tokenizer import load_tokenizer, train_and_save
    from specpolicy.family.train_ar import train_ar_model
    from specpolicy.family.trainer import bf16_autocast_pays

    a, paths = r.a, r.paths
    if r.todo("tokenizer"):
        print("== tokenizer", flush=True)
        t0 = time.time()
        tok = train_and_save(a.data, paths["tokenizer"], a.vocab_size)
        r.log("tokenizer", {"vocab_size": len(tok), "wall_s": round(time.time() - t0, 1), "data": a.data})
    r.tok = tok = load_tokenizer(paths["tokenizer"])

    if r.todo("target"):
        print("== target", flush=True)
        st = train_ar_model(a.target_size, r.train(), tok, r.cfg("target"), paths["target"], a.vocab_size, "target")
        st["weights_mb"] = round(_dir_mb(paths["target"]), 2)
        r.log("target", st)

    if r.todo("distill"):
        print("== distill", flush=True)
        n = a.distill_prompts or None
        st = distill(
            paths["target"],
            r.train(),
            tok,
            paths["distill"],
            n,
            a.distill_max_new,
            a.distill_batch,
            a.seed,
            bf16=not a.distill_fp32 and (bf16_autocast_pays(r.device) if r.bf16 is None else r.bf16),
            top_k=a.distill_top_k,
            device=r.device,
        )
        print(f"distill: {st}", flush=True)
        r.log("distill", st)

    if r.todo("ar-drafter"):
        print("== ar-drafter", flush=True)
        st = train_ar_model(
            a.drafter_size, r.distilled(), tok, r.cfg("drafter"), paths["ar-drafter"], a.vocab_size, "ar-drafter"
        )
        st["weights_mb"] = round(_dir_mb(paths["ar-drafter"]), 2)
        r.log("ar-drafter", st)


def _dllm_stages(r: _Run) -> None:
    """dllm-drafter: the diffusion phase, the phase matched to one-pass drafting, the calibration."""
    from specpolicy.family.block_diffusion import BLOCK_SIZE
    from specpolicy.family.train_dllm import train_dllm_model

    a, paths, tok = r.a, r.paths, r.tok
    if not r.todo("dllm-drafter"):
        return
    print("== dllm-drafter", flush=True)
    bs = a.block_size or BLOCK_SIZE
    init = Path(a.dllm_init) if a.dllm_init else paths["ar-drafter"]
    if a.dllm_epochs > 0:  # phase 1: Fast-dLLM v2 adaptation (random complementary masks, hard targets)
        st = train_dllm_model(init, r.distilled(), tok, r.cfg("dllm", pad_to_multiple=bs), paths["dllm-drafter"], bs)
        st["weights_mb"] = round(_dir_mb(paths["dllm-drafter"]), 2)
        r.log("dllm-drafter", st)
        init = paths["dllm-drafter"]
    if a.dllm_matched_epochs > 0:  # phase 2: the objective matched to one-pass drafting
        _dllm_matched(r, init, bs)
    if a.calibrate_examples > 0:  # confidence temperature, folded into the final norm
        from specpolicy.family.calibrate import calibrate_saved

        t0 = time.time()
        cal = calibrate_saved(paths["dllm-drafter"], r.distilled()[-a.calibrate_examples :], tok, a.seed)
        cal["wall_s"] = round(time.time() - t0, 1)
        print(f"calibration: {cal}", flush=True)
        r.log("dllm-drafter-calibration", cal)


def _dllm_matched(r: _Run, init: Path, bs: int) -> None:
    """The dLLM drafter's matched phase (suffix masks, the target's soft targets) from ``init``."""
    from specpolicy.family.distill import load_soft_targets, soft_targets_path
    from specpolicy.family.train_dllm import train_dllm_model
    from specpolicy.family.trainer import TrainConfig

    a, paths = r.a, r.paths
    print("== dllm-drafter (matched objective)", flush=True)
    soft = None
    if a.soft_weight > 0:
        soft_path = soft_targets_path(paths["distill"])
        if not soft_path.exists():
            raise SystemExit(
                f"error: --soft-weight={a.soft_weight} needs {soft_path}; "
                "redo the distill stage with --distill-top-k > 0"
            )
        soft = load_soft_targets(soft_path)
    exs, soft = r.distilled_with_soft(soft)
    mc = TrainConfig(
        epochs=a.dllm_matched_epochs,
        max_steps=a.dllm_matched_max_steps,
        batch_tokens=a.dllm_matched_batch_tokens,
        lr=a.dllm_matched_lr,
        warmup_steps=a.dllm_matched_warmup,
        seed=a.seed,
        bf16=r.bf16,
        log_every=a.log_every,
        pad_to_multiple=bs,
        device=r.device,
        max_seconds=a.max_seconds_per_stage,
    )
    st = train_dllm_model(
        init,
        exs,
        r.tok,
        mc,
        paths["dllm-drafter"],
        bs,
        name="dllm-drafter-matched",
        suffix_prob=a.suffix_prob,
        boundary_prob=a.boundary_prob,
        soft_targets=soft,
        soft_weight=a.soft_weight,
        checkpoint_every=a.dllm_checkpoint_every,
    )
    st["weights_mb"] = round(_dir_mb(paths["dllm-drafter"]), 2)
    r.log("dllm-drafter-matched", st)


def _deer_stage(r: _Run) -> None:
    """deer-drafter: DEER (arXiv 2512.15176), a LoRA on the dLLM drafter, two stages (train_deer)."""
    a, paths = r.a, r.paths
    if not r.todo("deer-drafter"):
        return
    print("== deer-drafter", flush=True)
    from specpolicy.family.train_deer import build_parser as deer_parser, run as train_deer
    from specpolicy.models.loading import bundled_dir

    bundled = paths["dllm-drafter"].resolve() == (bundled_dir() / "dllm-drafter").resolve()
    train_deer(
        deer_parser().parse_args(
            ["--distill", str(paths["distill"]), "--out", str(paths["deer-drafter"]), "--log", str(r.log_path)]
            + ["--base", "dllm-drafter" if bundled else str(paths["dllm-drafter"]), "--seed", str(a.seed)]
            + ["--max-len", str(a.max_len), "--threads", str(r.threads), "--device", r.device]
            + ([] if a.max_seconds_per_stage is None else ["--max-seconds", str(a.max_seconds_per_stage)])
            + shlex.split(a.deer_args)
        )
    )


def _feature_stages(r: _Run) -> None:
    """features (the target's hidden states), dflash-drafter, dflash-vocabulary, eagle3-drafter."""
    a, paths, tok = r.a, r.paths, r.tok
    if r.todo("features"):
        from specpolicy.family.feature_store import extract_features
        from specpolicy.family.train_dflash import feature_layers_for

        print("== features", flush=True)
        st = extract_features(
            paths["target"],
            r.distilled(),
            feature_layers_for(a, paths["target"]),
            paths["features"],
            a.feature_batch_tokens,
            device=r.device,
        )
        print(f"features: {st}", flush=True)
        r.log("features", st)

    if r.todo("dflash-drafter"):
        from specpolicy.family.feature_store import FeatureStore
        from specpolicy.family.train_dflash import DFLASH_SIZE, train_dflash

        print("== dflash-drafter", flush=True)
        exs, train_idx, held = r.conditioned_data()
        st = train_dflash(
            paths["target"],
            exs,
            FeatureStore(paths["features"]),
            r.cfg("dflash"),
            paths["dflash-drafter"],
            tok.pad_token_id,
            tok.convert_tokens_to_ids("|<MASK>|"),
            a.dflash_block_size,
            tuple(a.dflash_layer_ids),
            a.dflash_anchors,
            tuple(a.dflash_extension_probs),
            gamma=a.dflash_gamma,
            init=a.dflash_init,
            train_indices=train_idx,
            heldout_indices=held,
            checkpoint_every=a.dflash_checkpoint_every,
            size=None if a.dflash_layers is None else {**DFLASH_SIZE, "num_hidden_layers": a.dflash_layers},
            int8=a.dflash_int8,
        )
        r.log("dflash-drafter", st)

    if r.todo("dflash-vocabulary"):
        from specpolicy.family.train_dflash import add_draft_vocabulary

        print("== dflash-vocabulary", flush=True)
        exs, train_idx, _ = r.conditioned_data()
        st = add_draft_vocabulary(
            paths["dflash-drafter"], [exs[i] for i in train_idx], a.dflash_draft_vocab, (tok.eos_token_id,)
        )
        print(f"dflash-vocabulary: {st}", flush=True)
        command = f"python -m specpolicy.family --stages dflash-vocabulary --dflash-draft-vocab {a.dflash_draft_vocab}"
        r.log("dflash-vocabulary", {**st, "command": command})

    if r.todo("eagle3-drafter"):
        from specpolicy.family.feature_store import FeatureStore
        from specpolicy.family.train_eagle3 import train_eagle3

        print("== eagle3-drafter", flush=True)
        exs, train_idx, held = r.conditioned_data()
        st = train_eagle3(
            paths["target"],
            exs,
            FeatureStore(paths["features"]),
            r.cfg("eagle3"),
            paths["eagle3-drafter"],
            tok.pad_token_id,
            a.eagle3_draft_vocab,
            a.eagle3_ttt,
            train_indices=train_idx,
            heldout_indices=held,
        )
        r.log("eagle3-drafter", st)


def _dart_falcon_stages(r: _Run) -> None:
    """dart-drafter and falcon-drafter (Falcon, arXiv 2412.12639: CSGD on the target's top-layer features)."""
    a, paths, tok = r.a, r.paths, r.tok
    if r.todo("dart-drafter"):
        from specpolicy.family.feature_store import FeatureStore
        from specpolicy.family.train_dart import train_dart

        print("== dart-drafter", flush=True)
        exs, train_idx, held = r.conditioned_data()
        st = train_dart(
            paths["target"],
            exs,
            FeatureStore(paths["features"]),
            r.cfg("dart"),
            paths["dart-drafter"],
            tok.pad_token_id,
            a.dart_draft_vocab,
            train_indices=train_idx,
            heldout_indices=held,
            init=a.dart_init,
            checkpoint_every=50,
            stop_ids=(tok.eos_token_id,),
        )
        r.log("dart-drafter", st)

    if r.todo("falcon-drafter"):
        from specpolicy.family.feature_store import FeatureStore
        from specpolicy.family.train_falcon import train_falcon

        print("== falcon-drafter", flush=True)
        exs, train_idx, held = r.conditioned_data()
        st = train_falcon(
            paths["target"],
            exs,
            FeatureStore(paths["features"]),
            r.cfg("falcon"),
            paths["falcon-drafter"],
            tok.pad_token_id,
            train_indices=train_idx,
            heldout_indices=held,
            init=a.falcon_init,
            checkpoint_every=50,
        )
        r.log("falcon-drafter", st)


def _eval_stage(r: _Run) -> None:
    """eval: the family's acceptance on the test prompts, and the dLLM drafter's diagnostics."""
    from specpolicy.family.evaluate import evaluate
    from specpolicy.family.models import is_saved

    a, paths = r.a, r.paths
    if not r.todo("eval"):
        return
    print("== eval", flush=True)
    evaluate(r.out, a.test_data, a.eval_n, a.distill_max_new, a.eval_k, r.log_path)
    if a.eval_diagnostics_n > 0 and is_saved(paths["dllm-drafter"]):
        from specpolicy.family.diagnostics import diagnose

        t0 = time.time()
        diag = diagnose(
            str(paths["dllm-drafter"]),
            str(paths["target"]),
            ["gsm8k"],
            a.eval_diagnostics_n,
            a.distill_max_new,
            stride=12,
        )
        for rows in diag.values():  # the log keeps the curves; the reliability tables stay in the CLI's output
            rows.pop("reliability", None)
            rows.pop("reliability_given_prefix_correct", None)
        r.log("dllm-diagnostics", {**diag, "stride": 12, "wall_s": round(time.time() - t0, 1)})


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point (``python -m specpolicy.family``)."""
    return run(build_parser().parse_args(argv))
