"""The shared training loop: AdamW, linear warmup + cosine decay, grad clipping, bf16 autocast
where the device runs it natively.

Budgets are counted in epochs and optimizer steps by default, so a seeded run is reproducible:
the batch plan is a pure function of (example lengths, batch budget, seed, epoch) and every
random draw of a loss function comes from a seeded ``torch.Generator``. An optional wall-clock
budget (``TrainConfig.max_seconds``) cuts the plan to what fits after 20 steps, projects it again
at 25% and 50% of the budget or of the cut plan's later steps (whichever comes first), and reports
the steps it ran (``steps``); a rerun with
``max_steps=steps`` (no time budget) reproduces a run whose plan was not projected again
(``replans`` empty), and otherwise its steps and data order, not its learning rates before the
last re-projection.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from specpolicy.family.data import Example, batch_plan, collate


@dataclass
class TrainConfig:
    """Optimisation settings of one stage.

    Attributes:
        epochs: passes over the examples (int >= 1).
        max_steps: optional cap on optimizer steps (None = the whole plan).
        batch_tokens: padded-token budget per batch (see :func:`batch_plan`).
        lr: peak learning rate. warmup_steps: linear warmup length (steps).
        min_lr_ratio: final lr / peak lr at the end of the cosine.
        weight_decay: AdamW decay on 2-D weights (0 on norms and biases).
        betas: AdamW betas. clip: max global grad norm.
        seed: seeds data order and the loss function's generator.
        bf16: run forward/backward under ``torch.autocast(<device type>, dtype=torch.bfloat16)``;
            None (the default): where it runs on native kernels (``bf16_autocast_pays``), float32
            elsewhere.
        device: where the model and batches live (``"cpu"``, ``"cuda"``, ...).
        pad_to_multiple: batch length rounding (32 for block diffusion).
        log_every: steps between progress lines.
        max_seconds: optional wall-clock budget of the loop (seconds; None = none, the default).
            After the first :data:`BUDGET_WARMUP_STEPS` optimizer steps the step time is measured
            (the first step, with its one-off costs, left out) and the plan is cut to the steps
            whose projected time fits the budget; the LR schedule (warmup + cosine) is recomputed
            over that shorter total, so the run still ends at the min LR. A hard stop ends the loop
            when the wall time exceeds the budget by 10% anyway (validation or a slow machine).
            Reproducibility caveat: the steps run depend on the machine's speed and load, so the
            same seed and budget need not give the same run; ``train`` reports ``steps_planned``
            and ``steps``, and a rerun with ``max_steps=steps`` and no time budget reproduces the
            schedule and the data order (exactly when ``warmup_steps >= 20``: the first 20 steps'
            LR is then warmup, which does not depend on the total; a hard-stopped run's schedule is
            that of its cut plan: rerun it with ``max_steps=steps_cut``, stopped at ``steps``).
            A warmup as long as the cut plan is shortened to half of it (at least the steps run).
    """

    epochs: int = 1
    max_steps: int | None = None
    batch_tokens: int = 8192
    lr: float = 1e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0
    seed: int = 0
    bf16: bool | None = None
    pad_to_multiple: int = 1
    log_every: int = 10
    device: str = "cpu"
    max_seconds: float | None = None


#: Optimizer steps timed before a ``max_seconds`` budget cuts the plan.
BUDGET_WARMUP_STEPS = 20
#: A budgeted loop stops once its wall time exceeds the budget by this factor.
BUDGET_HARD_STOP = 1.1
#: Share of the budget the cut plan is projected to use (room for validation and saving).
BUDGET_FILL = 0.95
#: Shares of the budget -- or of the cut plan's steps after the cut, whichever comes first -- at which
#: a cut plan is projected again from the steps run since the cut (the first 20 steps can be slower
#: than the rest: other processes starting beside this one, CUDA warming up; a plan cut from such
#: steps can otherwise end long before a share of the budget is reached).
BUDGET_REPLAN_AT = (0.25, 0.5)
#: Steps run since the cut before a re-projection measures them.
BUDGET_REPLAN_MIN_STEPS = 10
#: A re-projected plan replaces the current one when they differ by more than this share.
BUDGET_REPLAN_TOLERANCE = 0.05


def budget_steps(total: int, done: int, elapsed: float, step_s: float, budget_s: float) -> int:
    """The steps of a plan of ``total`` that fit ``budget_s`` seconds: the ``done`` already run in
    ``elapsed`` s plus as many more of ``step_s`` s each as fit ``BUDGET_FILL * budget_s`` (never
    fewer than ``done``, never more than ``total``)."""
    more = int(max(0.0, BUDGET_FILL * budget_s - elapsed) / max(step_s, 1e-9))
    return max(done, min(total, done + more))


def _leavable_warmup(sched: TrainConfig, total: int, done: int) -> TrainConfig:
    """``sched`` with its warmup cut to half a plan of ``total`` steps (at least the ``done`` run)
    when that plan would never leave it; else ``sched``."""
    if sched.warmup_steps < total:
        return sched
    return replace(sched, warmup_steps=max(done, total // 2))


def bf16_autocast_pays(device: str | torch.device) -> bool:
    """Whether bfloat16 autocast runs on native bf16 arithmetic on ``device``: a CUDA device of
    compute capability 8.0 or newer (Ampere on), or a CPU with AVX512-BF16 or AMX. Elsewhere it is
    emulated: on an AVX2 CPU far slower than float32 (a DFlash training step of the bundled family
    took 19 s under it against 0.9 s in float32 on a 2-core AVX2 host), on AVX512 without BF16 no
    faster. Raises nothing: an unknown device type gets False."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 8
    if device.type != "cpu":
        return False
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # a torch without these probes: assume emulation
        return False


def uses_bf16(cfg: TrainConfig) -> bool:
    """Whether a stage with ``cfg`` trains under bf16 autocast (``cfg.bf16``, or where it pays)."""
    return bf16_autocast_pays(cfg.device) if cfg.bf16 is None else bool(cfg.bf16)


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Learning rate before optimizer step ``step`` (0-based) of ``total``: linear warmup to
    ``cfg.lr`` over ``cfg.warmup_steps``, then cosine down to ``cfg.lr * cfg.min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    frac = min(1.0, frac)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on >=2-D parameters only (tied embedding counted once)."""
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=1e-8)


def target_fields(target_config) -> dict:
    """The config.json fields a fresh draft head takes from its target's config: width,
    vocabulary, norm epsilon, positions, ``rope_theta``, and ``hidden_act`` ``"silu"``."""
    return dict(
        hidden_size=target_config.hidden_size,
        vocab_size=target_config.vocab_size,
        rms_norm_eps=target_config.rms_norm_eps,
        max_position_embeddings=target_config.max_position_embeddings,
        rope_theta=float(target_config.rope_parameters["rope_theta"]),
        hidden_act="silu",
    )


def init_linear(model: torch.nn.Module, zero_bias: bool = False) -> torch.nn.Module:
    """Draw every ``nn.Linear`` weight of ``model`` from N(0, 0.02) (in module order, from torch's
    global generator: seed it first); ``zero_bias``: their biases to 0 (Qwen3's initialisation).
    Returns ``model``."""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.02)
            if zero_bias and m.bias is not None:
                torch.nn.init.zeros_(m.bias)
    return model


def split_examples(
    examples: list[Example], train_indices: list[int] | None, heldout_indices: list[int] | None
) -> tuple[list[int], list[int], list[Example]]:
    """The drafter trainers' split: ``(train indices (default all), held-out indices (default
    none), the trained examples)``."""
    train_indices = list(range(len(examples))) if train_indices is None else list(train_indices)
    heldout_indices = list(heldout_indices or [])
    return train_indices, heldout_indices, [examples[i] for i in train_indices]


def checkpoint_hook(save: Callable[[str, dict], object], out_dir: str, every: int) -> Callable[[int], None]:
    """``on_step(step)`` for a ``train`` progress line: when ``every`` > 0 and ``every`` steps have
    passed since the last save, ``save(f"{out_dir}.checkpoint", {"train_step": step})`` (the model
    saved with ``train_step`` in its config, overwritten each time)."""
    last = [0]

    def on_step(step: int) -> None:
        if every > 0 and step - last[0] >= every:
            save(f"{out_dir}.checkpoint", {"train_step": step})
            last[0] = step

    return on_step


LossFn = Callable[[torch.nn.Module, dict, torch.Generator], tuple[torch.Tensor, int]]


def train_validated(
    model: torch.nn.Module,
    examples: list[Example],
    loss_fn: LossFn,
    cfg: TrainConfig,
    pad_id: int,
    name: str,
    validate: Callable[[int, bool], None],
    val_every: int,
    checkpoint: Callable[[int], None],
) -> dict:
    """``train`` with a held-out validation curve, as the drafter trainers run it:
    ``validate(step, training)`` before the first step (step 0), at every progress line whose step
    is a multiple of ``val_every`` and after the last step (``training``: the mode to leave the model
    in), and ``checkpoint(step)`` (``checkpoint_hook``) at every progress line.

    Returns:
        ``train``'s stats.
    """

    def on_log(step: int, _model: torch.nn.Module) -> None:
        if step % val_every == 0:
            validate(step, True)
        checkpoint(step)

    validate(0, False)
    stats = train(model, examples, loss_fn, cfg, pad_id, name=name, on_log=on_log)
    validate(stats["steps"], False)
    return stats


def train(
    model: torch.nn.Module,
    examples: list[Example],
    loss_fn: LossFn,
    cfg: TrainConfig,
    pad_id: int,
    name: str = "model",
    on_log: Callable[[int, torch.nn.Module], None] | None = None,
) -> dict:
    """Train ``model`` in place.

    Args:
        examples: training examples.
        loss_fn: ``(model, batch, generator) -> (mean loss (0-d float tensor), n_target_tokens)``
            where ``batch`` is :func:`collate`'s dict plus ``index`` ((B,) int64: each row's
            index into ``examples``).
        pad_id: pad token id for collation.
        name: label used in progress lines.
        on_log: called as ``on_log(steps_done, model)`` at every progress line (e.g. to save a
            checkpoint; the model is in train mode and must not be modified).
    Returns:
        stats dict: ``steps``, ``epochs``, ``final_loss`` (token-weighted mean over the last
        ``max(10, 5%)`` steps), ``first_loss``, ``loss_curve`` (list of ``[step, loss, lr]``
        averaged per ``log_every`` steps), ``wall_s``, ``tokens_per_s`` (padded input tokens),
        ``target_tokens``, ``config`` (``bf16`` as run); with ``cfg.max_seconds`` also
        ``time_budget_s``, ``steps_planned`` (the plan before the cut), ``steps_cut`` (the plan
        after it, the LR schedule's final total), ``step_s`` (the seconds per step measured over
        steps 2-20), ``replans`` (``[step, seconds per step since the cut, new plan]`` for each time
        the plan, projected again at 25% and 50% of the budget, moved by more than 5%; the
        schedule is recomputed over the new plan from that step on) and ``hard_stop`` (whether the
        10% hard stop ended the loop).
    Raises:
        ValueError: empty ``examples``, a non-finite loss or a ``max_seconds`` that is not > 0.
    """
    if not examples:
        raise ValueError("no training examples")
    lengths = [len(e) for e in examples]
    plan: list[list[int]] = []
    for ep in range(cfg.epochs):
        plan += batch_plan(lengths, cfg.batch_tokens, cfg.seed, ep, cfg.pad_to_multiple)
    steps_per_epoch = len(plan) / max(1, cfg.epochs)
    if cfg.max_steps is not None:
        plan = plan[: cfg.max_steps]
    total = len(plan)
    if cfg.max_seconds is not None and not cfg.max_seconds > 0:
        raise ValueError(f"[{name}] max_seconds={cfg.max_seconds}; it must be > 0 (seconds) or None")
    budget = None if cfg.max_seconds is None else _Budget(cfg.max_seconds, total, name)
    sched = cfg  # the LR schedule's settings (a budget may cut its warmup)
    gen = torch.Generator().manual_seed(cfg.seed + 17)  # CPU: loss functions draw on the CPU and move
    device = torch.device(cfg.device)
    model.to(device)
    opt = make_optimizer(model, cfg)
    model.train()
    bf16 = uses_bf16(cfg)
    t0 = time.time()
    run = _Progress(name, steps_per_epoch, t0)
    print(f"[{name}] {len(examples)} examples, {total} steps ({steps_per_epoch:.0f}/epoch)", flush=True)
    for step, idx in enumerate(plan):
        if step >= total:
            break
        if budget is not None and budget.over(step, t0):
            break
        batch = {k: v.to(device) for k, v in collate([examples[i] for i in idx], pad_id, cfg.pad_to_multiple).items()}
        batch["index"] = torch.tensor(idx, dtype=torch.long)  # (B,) rows' indices into ``examples`` (CPU)
        lr = lr_at(step, total, sched)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, ntok = loss_fn(model, batch, gen)
        if not torch.isfinite(loss):
            raise ValueError(f"[{name}] non-finite loss at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        run.add(float(loss.detach()), ntok, batch["input_ids"].numel())
        if budget is not None:
            total, sched = budget.after_step(step, t0, total, sched)
        if (step + 1) % cfg.log_every == 0 or step + 1 == total:
            run.log(step, total, lr)
            if on_log is not None:
                on_log(step + 1, model)
    wall = time.time() - t0
    model.eval()
    cfgd = asdict(cfg)
    cfgd["betas"] = list(cfg.betas)
    cfgd["bf16"] = bf16  # as run
    return {**({} if budget is None else budget.stats(total)), **run.stats(wall, steps_per_epoch), "config": cfgd}


class _Progress:
    """The losses of one training loop: per step, its progress lines and curve, and its stats."""

    def __init__(self, name: str, steps_per_epoch: float, t0: float) -> None:
        self.name, self.steps_per_epoch, self.t0 = name, steps_per_epoch, t0
        self.hist_loss: list[float] = []
        self.hist_tok: list[int] = []
        self.curve: list[list] = []
        self.win_loss, self.win_tok, self.in_tokens = 0.0, 0, 0

    def add(self, loss: float, ntok: int, in_tokens: int) -> None:
        """One step's mean loss, its target tokens and its padded input tokens."""
        self.hist_loss.append(loss)
        self.hist_tok.append(ntok)
        self.win_loss += loss * ntok
        self.win_tok += ntok
        self.in_tokens += in_tokens

    def log(self, step: int, total: int, lr: float) -> None:
        """A progress line and a ``[step, loss, lr]`` curve point for the steps since the last one."""
        el = time.time() - self.t0
        mean = self.win_loss / max(1, self.win_tok)
        self.curve.append([step + 1, round(mean, 4), lr])
        print(
            f"[{self.name}] step {step + 1}/{total} ep {(step + 1) / self.steps_per_epoch:.2f} "
            f"loss {mean:.4f} lr {lr:.2e} "
            f"{self.in_tokens / el:.0f} tok/s elapsed {el:.0f}s eta {el / (step + 1) * (total - step - 1):.0f}s",
            flush=True,
        )
        sys.stdout.flush()
        self.win_loss, self.win_tok = 0.0, 0

    def stats(self, wall: float, steps_per_epoch: float) -> dict:
        """``train``'s stats of the steps run (see its Returns)."""
        total = len(self.hist_loss)  # the steps run
        n_last = max(10, total // 20)
        tl, tt = self.hist_loss[-n_last:], self.hist_tok[-n_last:]
        return dict(
            steps=total,
            epochs=round(total / steps_per_epoch, 3),
            first_loss=round(self.hist_loss[0], 4),
            final_loss=round(sum(a * b for a, b in zip(tl, tt)) / max(1, sum(tt)), 4),
            loss_curve=self.curve,
            wall_s=round(wall, 1),
            tokens_per_s=round(self.in_tokens / max(wall, 1e-9), 1),
            target_tokens=int(sum(self.hist_tok)),
        )


class _Budget:
    """A loop's wall-clock budget (``TrainConfig.max_seconds``): the plan cut after the timed steps,
    projected again at ``BUDGET_REPLAN_AT``, and the hard stop (module docstring)."""

    def __init__(self, seconds: float, planned: int, name: str) -> None:
        self.seconds, self.planned, self.name = seconds, planned, name
        self.step_s: float | None = None  # seconds per step measured over steps 2-20
        self.first_step_s = 0.0
        self.replan_at, self.replans = list(BUDGET_REPLAN_AT), []
        self.cut_step, self.cut_el = 0, 0.0
        self.hard_stop = False

    def over(self, step: int, t0: float) -> bool:
        """Whether the loop stops before ``step``: its wall time is past the hard stop."""
        if time.time() - t0 > BUDGET_HARD_STOP * self.seconds:
            self.hard_stop = True
            print(
                f"[{self.name}] hard stop at step {step}: {time.time() - t0:.0f}s > 1.1 x {self.seconds:.0f}s",
                flush=True,
            )
            return True
        return False

    def after_step(self, step: int, t0: float, total: int, sched: TrainConfig) -> tuple[int, TrainConfig]:
        """After ``step``: the plan's steps and the LR schedule's settings, cut after the timed steps
        or projected again at a ``BUDGET_REPLAN_AT`` share."""
        budget, name = self.seconds, self.name
        if step == 0:
            self.first_step_s = time.time() - t0  # CUDA / allocator warm-up: not a step's cost
        if step + 1 == min(BUDGET_WARMUP_STEPS, total) and total > step + 1:
            el = time.time() - t0
            self.step_s = (el - self.first_step_s) / max(1, step)
            total = budget_steps(total, step + 1, el, self.step_s, budget)
            sched = _leavable_warmup(sched, total, step + 1)
            self.cut_step, self.cut_el = step + 1, el
            print(
                f"[{name}] time budget {budget:.0f}s: {self.step_s:.3f}s/step over steps 2-{step + 1}, "
                f"plan cut to {total} of {self.planned} steps (LR schedule recomputed)",
                flush=True,
            )
        elif (
            self.step_s is not None
            and self.replan_at
            and step + 1 - self.cut_step >= BUDGET_REPLAN_MIN_STEPS
            and (
                time.time() - t0 >= self.replan_at[0] * budget
                or step + 1 - self.cut_step >= self.replan_at[0] * (total - self.cut_step)
            )
        ):
            self.replan_at.pop(0)  # project the plan again from the steps run since the cut
            el = time.time() - t0
            recent_s = (el - self.cut_el) / max(1, step + 1 - self.cut_step)
            projected = budget_steps(self.planned, step + 1, el, recent_s, budget)
            if abs(projected - total) > BUDGET_REPLAN_TOLERANCE * total:
                self.replans.append([step + 1, round(recent_s, 4), projected])
                print(
                    f"[{name}] at {el:.0f}s of {budget:.0f}s: {recent_s:.3f}s/step since the cut, "
                    f"plan {total} -> {projected} steps (LR schedule recomputed)",
                    flush=True,
                )
                total = projected
                sched = _leavable_warmup(sched, total, step + 1)
        return total, sched

    def stats(self, cut: int) -> dict:
        """The budget's entries of ``train``'s stats; ``cut`` is the plan's final total."""
        return dict(
            time_budget_s=self.seconds,
            steps_planned=self.planned,
            steps_cut=cut,
            step_s=None if self.step_s is None else round(self.step_s, 4),
            replans=self.replans,
            hard_stop=self.hard_stop,
        )
