"""The run summary says what ran (issue 30, 6a): a title naming the method, the data set, prompts x
new tokens, device and dtype (and sampling, batch size, stop strings when set), and the oracle
comparison in one plain sentence that names the command explaining it in full."""

from __future__ import annotations

import io

from rich.console import Console

from specpolicy.analysis.tables import oracle_sentence, print_summary, run_header

CENSORED = {
    "source": "rounds (self-consistency, censored at fully accepted rounds)",
    "fraction_of_oracle": 0.6314,
    "policy_speedup_modeled": 1.22,
    "oracle_speedup_modeled": 1.93,
    "censored_positions": 17,
}


def _method(tokens_per_s, rounds, drafted):
    return {
        "tokens_per_s": tokens_per_s,
        "rounds": rounds,
        "drafted_rounds": drafted,
        "acceptance_rate": 0.5,
        "mean_accepted_length": 2.0,
        "mean_speculation_length": 1.0,
        "tokens_per_round": 1.5,
        "max_accepted_length": 4,
        "max_speculation_length": 8,
        "drafter_passes_per_round": 0.5,
        "generated_tokens": 512,
    }


def _summary(generation=None, sampling=None, dataset=None, **extra):
    summary = {
        "method": "fastdllm+failfast",
        "prompts": 20,
        "prompts_total": 20,
        "partial": False,
        "lossless_fraction": 1.0,
        "not_lossless": {},
        "methods": {"fastdllm+failfast": _method(150.0, 300, 200), "vanilla": _method(100.0, 512, 0)},
        "sampling": sampling or {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "mode": "greedy"},
        "runtime": {"device": "cpu", "dtype": "float32", "seed": 0},
        "config": {
            "dataset": dataset or {"name": "gsm8k", "path": None, "num_prompts": 20, "offset": 0},
            "generation": {"max_new_tokens": 256, "batch_size": 1, "stop": [], **(generation or {})},
        },
        "oracle": dict(CENSORED),
    }
    summary.update(extra)
    return summary


def _printed(summary, width=100, **kwargs) -> list[str]:
    buf = io.StringIO()
    print_summary(summary, console=Console(width=width, file=buf), **kwargs)
    return buf.getvalue().splitlines()


def test_the_table_title_says_what_ran():
    lines = _printed(_summary())
    assert lines[0].rstrip() == "fastdllm+failfast on gsm8k, 20 prompts x 256 new tokens, cpu float32, greedy"
    assert lines[1].startswith("┏")  # the title is the line right above the table


def test_sampling_batch_size_stop_strings_and_a_prompt_file_are_named_when_set():
    summary = _summary(
        generation={"batch_size": 8, "stop": ["\n\nQ:"]},
        sampling={"temperature": 0.7, "top_k": 0, "top_p": 0.9, "mode": "sampling"},
        dataset={"name": "gsm8k", "path": "/data/my-prompts.jsonl", "num_prompts": 20},
    )
    assert run_header(summary) == (
        "fastdllm+failfast on my-prompts.jsonl, 20 prompts x 256 new tokens, cpu float32, "
        "sampling (temperature 0.7, top_p 0.9), batch size 8, stop '\\n\\nQ:'"
    )
    # a partial run keeps saying so
    partial = _summary(partial=True, prompts=7)
    assert run_header(partial).startswith("fastdllm+failfast on gsm8k, 7 prompts x 256 new tokens")
    assert "(PARTIAL: 7 of 20 planned prompts)" in " ".join(" ".join(_printed(partial)).split())


def test_the_oracle_is_one_plain_sentence_that_names_its_command():
    lines = _printed(_summary(), width=160, run_dir="outputs/policy=failfast")
    oracle = [line for line in lines if line.startswith("oracle")]
    assert oracle == [
        "oracle: this policy reaches at most 0.63 of an oracle length policy's speedup; "
        "see python -m specpolicy.analysis.oracle outputs/policy=failfast"
    ]
    assert not any("censored" in line or "upper bound" in line for line in lines)
    # narrower than the sentence: the command goes whole onto a line of its own
    narrow = io.StringIO()
    print_summary(_summary(), console=Console(width=90, file=narrow), run_dir="outputs/policy=failfast")
    tail = narrow.getvalue().splitlines()[-2:]
    assert tail == [
        "oracle: this policy reaches at most 0.63 of an oracle length policy's speedup;",
        "  see python -m specpolicy.analysis.oracle outputs/policy=failfast",
    ]
    # exact (replayed) figures are not called a bound; a run dir not given reads DIR
    exact = {**CENSORED, "source": "replay (exact)", "censored_positions": 0}
    assert oracle_sentence(exact) == (
        "oracle: this policy reaches 0.63 of an oracle length policy's speedup; "
        "see python -m specpolicy.analysis.oracle DIR"
    )
    assert oracle_sentence({**CENSORED, "fraction_of_oracle": 1.2}).startswith(
        "oracle: no fraction of the oracle's speedup ("
    )
    assert oracle_sentence({"fraction_of_oracle": None, "unavailable": "no vanilla step"}).startswith(
        "oracle: n/a (no vanilla step); see python -m specpolicy.analysis.oracle"
    )


def test_the_oracle_sentence_gives_the_clock_free_fraction_beside_the_measured_one():
    """With a profile's costs (``oracle.profile_costs``) the sentence says which fraction follows the
    machine's load and which is clock-free."""
    clock_free = {"profile": "a6000-qwen7b", "fraction_of_oracle": 0.75, "policy_speedup_modeled": 1.9,
                  "oracle_speedup_modeled": 2.5}  # fmt: skip
    text = oracle_sentence({**CENSORED, "profile_costs": clock_free})
    assert text.startswith(
        "oracle: this policy reaches at most 0.63 of an oracle length policy's speedup with this machine's "
        "measured costs (they follow its load), at most 0.75 with the a6000-qwen7b profile's costs (clock-free); "
    )
