"""Placement units are torchvision's models exactly: same parameters, same outputs."""

from __future__ import annotations

import pytest
import torch
from torchvision import models as tvm

from ralp_pipe.config import MODELS, ConfigError, load
from ralp_pipe.engine import models

# Published torchvision parameter counts (1000 classes).
KNOWN = {
    "alexnet": 61_100_840,
    "vgg11": 132_863_336,
    "vgg16": 138_357_544,
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "resnet152": 60_192_808,
    "inception_v3": 27_161_264 - 3_326_696,  # torchvision's count less the auxiliary classifier's
}
# what torchvision's factory needs to build the model our units are made of
FACTORY_KWARGS = {"inception_v3": {"aux_logits": False, "init_weights": False}}


# both models on the meta device: parameters with their shapes, none initialised (VGG-16 initialised took seconds)
@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_units_hold_exactly_the_torchvision_parameters(name: str) -> None:
    with torch.device("meta"):
        model = models.build(name, 1000)
        reference = getattr(tvm, name)(weights=None, **FACTORY_KWARGS.get(name, {}))
    units = models.placement_units(model)
    unit_params = [p for u in units for p in u.module.parameters()]
    assert len({id(p) for p in unit_params}) == len(unit_params), "a parameter sits in two units"
    assert {id(p) for p in unit_params} == {id(p) for p in model.parameters()}
    total = sum(models.parameter_count(u.module) for u in units)
    assert total == models.parameter_count(model) == sum(p.numel() for p in reference.parameters())
    if name in KNOWN:
        assert total == KNOWN[name]


@pytest.mark.slow  # a VGG-11 with a 21841-class head (~2.4 s)
def test_imagenet22k_head_changes_only_the_last_layer() -> None:
    units = models.placement_units(models.build("vgg11", 21841))
    assert sum(models.parameter_count(u.module) for u in units) == KNOWN["vgg11"] - 4097 * 1000 + 4097 * 21841


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("alexnet", 64),
        pytest.param("vgg11_bn", 32, marks=pytest.mark.slow),
        pytest.param("resnet50", 32, marks=pytest.mark.slow),
        ("resnet18", 40),
        pytest.param("inception_v3", 75, marks=pytest.mark.slow),  # 2-3 s: its init and forward
    ],
)
def test_sequential_of_units_computes_the_model(name: str, size: int) -> None:
    torch.manual_seed(0)
    model = models.build(name, 10).eval()
    units = models.placement_units(model)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(torch.nn.Sequential(*(u.module for u in units))(x), model(x), rtol=0, atol=0)
    assert models.activation_shapes(units, size, batch=2)[-1] == (2, 10)


@pytest.mark.parametrize("name", ["vgg11", "resnet50", "alexnet", "inception_v3"])
def test_default_split_puts_every_dense_unit_on_the_ps_device(name: str) -> None:
    units = models.model_units(name, 10, 0.5, "meta")  # the layers and their sizes: nothing initialised
    k = models.default_split(units)
    lower, upper = models.split(units, k)
    assert not any(u.is_dense for u in units[:k]) and units[k].is_dense
    assert not any(isinstance(m, torch.nn.Linear) for m in lower.modules())
    with torch.device("meta"):
        whole = models.build(name, 10)
    assert models.parameter_count(lower) + models.parameter_count(upper) == models.parameter_count(whole)


def test_split_out_of_range_says_which_points_are_allowed() -> None:
    units = models.placement_units(models.build("resnet18", 10))
    with pytest.raises(ValueError, match=rf"choose 1..{len(units) - 1}"):
        models.split(units, len(units))


@pytest.mark.slow
def test_activation_bytes_are_the_unit_outputs_of_a_real_batch() -> None:
    """The estimate from meta units equals the float32 outputs every unit produces for a real batch of 3."""
    units = models.placement_units(models.build("resnet18", 10).eval())
    x, produced = torch.zeros(3, 3, 40, 40), 0
    with torch.no_grad():
        for unit in units:
            x = unit.module(x)
            produced += x.numel() * x.element_size()
    meta = models.model_units("resnet18", 10, 0.0, "meta")
    assert models.activation_bytes(meta, 40, 3) == produced
    assert models.activation_bytes(meta, 40, 3, value_bytes=2) == produced // 2


def test_inception_v3_refuses_an_image_its_stem_would_shrink_to_nothing() -> None:
    with pytest.raises(ConfigError, match="train.image_size=64 must be at least 75"):
        load(["model=inception_v3", "train.image_size=64"])
    assert load(["model=inception_v3", "train.image_size=75"]).model.dropout == 0.5
