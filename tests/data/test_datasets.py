"""Prompt files: every bad row is reported as ``file:line`` (one line, a ConfigError), the text
field is chosen per row, and ``dataset.num_prompts`` takes an integer >= 1 or ``all``."""

from __future__ import annotations

import gzip
import json

import pytest

from specpolicy.data import datasets
from specpolicy.data.datasets import load_prompts


def write(path, lines: list[bytes]) -> str:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


def one_line_error(path: str) -> str:
    """The message of the ConfigError (a ValueError, reported in one line by the CLI)."""
    with pytest.raises(ValueError) as info:
        load_prompts("mine", path)
    assert type(info.value).__name__ == "ConfigError"
    message = str(info.value)
    assert "\n" not in message
    return message


def test_rows_mixing_text_fields_each_use_their_own(tmp_path):
    path = write(
        tmp_path / "mixed.jsonl",
        [
            b'{"prompt": "first"}',
            b'{"question": "second"}',
            b"",
            b'{"problem": "third", "id": "p3"}',
            b'{"text": "fourth"}',
        ],
    )
    prompts = load_prompts("mine", path)
    assert [p.text for p in prompts] == ["first", "second", "third", "fourth"]
    assert [p.prompt_id for p in prompts] == ["mine/0", "mine/1", "p3", "mine/3"]
    assert [p.source for p in prompts] == [f"{path}:1", f"{path}:2", f"{path}:4", f"{path}:5"]


def test_a_malformed_json_row_is_named_by_file_and_line_in_plain_words(tmp_path):
    path = write(tmp_path / "p.jsonl", [b'{"prompt": "ok"}', b'{"prompt": "cut', b'{"prompt": "ok"}'])
    assert one_line_error(path) == (
        f"{path}:2: malformed JSON: a string is not closed: the line ends inside it (a "
        f'closing " is missing); each line of dataset.path must be one JSON object '
        f"(UTF-8) with a non-empty string in one of the fields prompt, question, "
        f"problem, text"
    )


def test_every_bad_line_of_every_kind_is_reported_at_once(tmp_path):
    """The issue's file: bad JSON on line 2, an array on line 4, a row without text on line 5 --
    all three in the first report (no second round after fixing the first two)."""
    path = write(
        tmp_path / "p.jsonl",
        [
            b'{"prompt": "ok"}',
            b'{"prompt": "cut',
            b'{"prompt": "ok"}',
            b"[1, 2]",
            b'{"answer": "42"}',
            b'{"question": "fine"}',
        ],
    )
    message = one_line_error(path)
    assert message == (
        f"{path}: 3 bad lines: line 2: malformed JSON: a string is not closed: the line ends inside "
        f'it (a closing " is missing); line 4: an array ([...]), not a JSON object ({{...}}); line 5: '
        f"no prompt text: none of the fields prompt, question, problem, text holds a non-empty string "
        f"(its fields: answer); each line of dataset.path must be one JSON object (UTF-8) with a "
        f"non-empty string in one of the fields prompt, question, problem, text"
    )
    assert "Invalid control character" not in message  # Python's words, not the user's


def test_a_row_past_num_prompts_is_checked_too(tmp_path):
    path = write(tmp_path / "p.jsonl", [b'{"prompt": "ok"}', b'{"answer": "42"}'])
    with pytest.raises(ValueError, match=f"{path}:2: no prompt text"):
        load_prompts("mine", path, 1)


@pytest.mark.parametrize(
    "line, problem",
    [
        (b'{"prompt": "a\tb"}', "a raw control character '\\t' inside a string at column 14; write it as \\t"),
        (
            b'{"prompt": "x",}',
            "a key in double quotes is expected at column 16 (JSON has no single quotes and no comma "
            "before a closing })",
        ),
        (b"{'prompt': 'x'}", "a key in double quotes is expected at column 2"),
        (b'{"prompt" "x"}', "a colon is missing after the key, at column 11"),
        (b'{"prompt": "x"} {}', "more than one JSON value on the line (extra text from column 17)"),
        (
            b'{"prompt": True}',
            "no JSON value at column 12 (strings need double quotes; true, false and null are lower case",
        ),
        (b'{"prompt": "x"', "the line ends before the object is closed (a } is missing)"),
        (b'{"prompt": "a\\qb"}', "a backslash at column 14 starts no JSON escape"),
        (b"hello", "the line is not JSON (a JSON object starts with {)"),
        (b'"just text"', "a string, not a JSON object ({...})"),
    ],
)
def test_json_mistakes_are_said_in_plain_words(tmp_path, line, problem):
    path = write(tmp_path / "p.jsonl", [line])
    message = one_line_error(path)
    assert message.startswith(f"{path}:1: ") and problem in message


def test_many_bad_lines_are_reported_up_to_a_limit_then_counted(tmp_path):
    path = write(tmp_path / "p.jsonl", [b'{"prompt": "ok"}'] + [b"[]"] * 25)
    message = one_line_error(path)
    assert message.startswith(f"{path}: 25 bad lines: line 2: an array")
    assert message.count("not a JSON object") == datasets.MAX_REPORTED == 20
    assert "line 21: an array" in message and "line 22:" not in message
    assert "; and 5 more (lines 22, 23, 24, 25, 26); each line of dataset.path" in message


def test_a_non_utf8_byte_is_named_by_file_and_line(tmp_path):
    path = write(tmp_path / "p.jsonl", [b'{"prompt": "ok"}', b'{"prompt": "caf\xe9"}'])
    assert one_line_error(path).startswith(f"{path}:2: not UTF-8 text (byte 0xe9")


def test_a_lone_surrogate_is_named_by_file_and_line(tmp_path):
    path = write(tmp_path / "p.jsonl", [b'{"prompt": "ok"}', b'{"prompt": "a \\udc80 b"}'])
    assert one_line_error(path).startswith(f"{path}:2: the text holds a lone surrogate")


def test_a_row_without_a_text_field_is_named_by_file_and_line(tmp_path):
    path = write(tmp_path / "p.jsonl", [b'{"prompt": "ok"}', b'{"answer": "42"}'])
    message = one_line_error(path)
    assert message.startswith(f"{path}:2: no prompt text")
    assert "prompt, question, problem, text" in message and "answer" in message


def test_an_empty_file_is_named(tmp_path):
    path = write(tmp_path / "empty.jsonl", [])
    assert one_line_error(path) == (
        f"dataset.path={path!r} holds no rows (an empty file); it needs one JSON object per line"
    )


def test_a_gzip_file_reads_and_a_missing_file_is_named(tmp_path):
    path = tmp_path / "p.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"question": "zipped"}) + "\n")
    assert [p.text for p in load_prompts("mine", str(path))] == ["zipped"]
    with pytest.raises(ValueError, match="dataset.path='nope.jsonl' does not exist"):
        load_prompts("mine", "nope.jsonl")


@pytest.mark.parametrize("value", [-1, 0, 2.5, "some", True])
def test_num_prompts_out_of_range_is_an_error_stating_the_range(value):
    with pytest.raises(ValueError) as info:
        load_prompts("gsm8k", None, value)
    assert str(info.value) == (
        f"dataset.num_prompts must be an integer >= 1, or all (every prompt after dataset.offset), got {value!r}"
    )


def test_num_prompts_all_or_null_means_every_prompt():
    everything = load_prompts("gsm8k")
    assert len(everything) > 20
    assert datasets.num_prompts_value("all") is None and datasets.num_prompts_value(None) is None
    assert len(load_prompts("gsm8k", None, datasets.num_prompts_value("all"), offset=5)) == len(everything) - 5
    assert [p.prompt_id for p in load_prompts("gsm8k", None, 3, offset=2)] == ["gsm8k/2", "gsm8k/3", "gsm8k/4"]
    assert [p.prompt_id for p in load_prompts("gsm8k", None, 5, offset=len(everything) - 1)] == [
        everything[-1].prompt_id
    ]


def test_an_offset_past_the_last_prompt_is_an_error_not_an_empty_run():
    rows = len(load_prompts("gsm8k"))
    with pytest.raises(ValueError) as info:
        load_prompts("gsm8k", None, 10, offset=rows)
    assert str(info.value) == (
        f"dataset.offset={rows} is past the last prompt of dataset.name='gsm8k' ({rows} rows; accepted 0..{rows - 1})"
    )
