"""benchmarks/acceptance_headroom.py: the features of a drafted token's distribution, and a fit that
finds what the confidence does not hold."""

from __future__ import annotations

import math

import torch

from conftest import load_benchmark


def test_features_read_the_drafters_distribution():
    module = load_benchmark("acceptance_headroom")
    weight = torch.eye(3)  # lm_head = identity: logits are the hidden rows
    hidden = torch.tensor([[math.log(0.7), math.log(0.2), math.log(0.1)], [0.0, 0.0, 0.0]])
    conf = torch.tensor([0.7, 1 / 3])
    x, y, c = module.features([(hidden, conf, torch.tensor([1.0, 0.0]))], weight)
    col = {name: x[:, i] for i, name in enumerate(module.FEATURES)}
    entropy = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    assert torch.allclose(col["entropy"], torch.tensor([entropy, math.log(3)]), atol=1e-5)
    assert torch.allclose(col["margin"], torch.tensor([0.5, 0.0]), atol=1e-5)
    assert torch.allclose(col["log_p2"], torch.log(torch.tensor([0.2, 1 / 3])), atol=1e-5)
    assert col["position"].tolist() == [1.0, 2.0]
    assert torch.allclose(col["cumulative"], torch.log(torch.tensor([0.7, 0.7 / 3])), atol=1e-5)
    assert torch.allclose(col["confidence"], torch.tensor([math.log(0.7 / 0.3), math.log(0.5)]), atol=1e-5)
    assert y.tolist() == [1.0, 0.0] and torch.equal(c, conf)


def test_a_feature_the_confidence_lacks_raises_the_held_out_auc():
    module = load_benchmark("acceptance_headroom")
    g = torch.Generator().manual_seed(0)
    n = 4000
    confidence, other = torch.randn(n, 1, generator=g), torch.randn(n, 1, generator=g)
    labels = (torch.rand(n, generator=g) < torch.sigmoid(confidence[:, 0] + 2.0 * other[:, 0])).float()
    x = torch.cat([confidence, other], dim=1)
    alone = module.fit_and_score(x[:3000, :1], labels[:3000], x[3000:, :1], labels[3000:], 0)
    both = module.fit_and_score(x[:3000], labels[:3000], x[3000:], labels[3000:], 0)
    assert both["auc"] > alone["auc"] + 0.1 and both["brier"] < alone["brier"]
