"""One metric list (``specpolicy.analysis.labels.FIGURES``) labels every metric everywhere: the run's
table, the sweep report, the serving tables of the report and of a batched run."""

from __future__ import annotations

from specpolicy.analysis import labels, report, tables
from specpolicy.run import batch_experiment


def test_every_printed_figure_list_takes_its_labels_from_the_one_list():
    assert tables.FIGURES is labels.FIGURES
    for label, key, fmt in batch_experiment.SERVING_ROWS:
        assert (label, fmt) == (labels.FIGURES[key].label, labels.FIGURES[key].fmt)
    for key, (title, fmt) in report.SERVING_FIGURES.items():
        assert (title, fmt) == (labels.FIGURES[key].short, labels.FIGURES[key].fmt)
    for title, key, _, _ in report.REPORT_COLUMNS:
        if key in labels.FIGURES:
            assert title == labels.FIGURES[key].short
    assert [k for _, k, _ in batch_experiment.SERVING_ROWS] == list(labels.SERVING_KEYS)


def test_a_serving_throughput_has_one_name_in_both_serving_tables():
    (run_label,) = [label for label, key, _ in batch_experiment.SERVING_ROWS if key == "throughput_tokens_per_s"]
    assert run_label == labels.FIGURES["throughput_tokens_per_s"].label
    assert report.SERVING_FIGURES["throughput_tokens_per_s"][0] == labels.FIGURES["throughput_tokens_per_s"].short
    assert labels.FIGURES["rounds"].fmt.format(12.0) == labels.FIGURES["rounds"].fmt.format(12) == "12"
