"""The 9 "light" models shipped in the onnx wheel (onnx/backend/test/data/light): each runs
and matches onnxruntime at its declared 1x3x224x224 with random weights of the same shapes
(the shipped ones are all 0.02, which hides errors), and loads as shipped into the same device
program; the cheaper five also run with their shipped weights (see SHIPPED); densenet121 and
squeezenet also over a sequence of batch and spatial sizes (the other seven hard-code batch 1
in a Reshape)."""
import numpy as np
import onnx
import pytest

from engine import Network, build_program
from tests.conftest import run_vs_ort
from tests.models import light_model_paths, make_input_dynamic, randomize_weights, real_inputs

MODELS = sorted(light_model_paths())


def _net(model, device, prog=None):
    """Shape-agnostic impls: the network runs one inference, so the static impls `--impls auto`
    builds in the background for its shape would be built for no inference to take."""
    return Network(prog or build_program(model), device, impls="dynamic")


def _feeds(model, shapes, seed):
    rng = np.random.default_rng(seed)
    (name,) = real_inputs(model)
    return [{name: rng.standard_normal(s).astype(np.float32)} for s in shapes]


# The shipped files make their weights with ConstantOfShape nodes, which the load folds into
# constants (engine/program.py): a shipped file's device program is its random-weight copy's, node
# for node, with other constant values (test_light_model_shipped_and_random_weights asserts it for
# all nine). Its inference then runs the same kernels over the same shapes as the random-weight
# run; it stays for the five cheaper models, and vgg19, zfnet512, bvlc_alexnet and resnet50 (the
# costly inferences: 37M to 103M weights in the first three's fully connected layers) run their
# random weights only.
SHIPPED = ["densenet121", "inception_v1", "inception_v2", "shufflenet", "squeezenet"]


def _device_nodes(prog):
    """What the device program runs: each node's op, tensors, and its constants' shapes."""
    return [(n.op, tuple(n.inputs), tuple(n.outputs),
             tuple(np.shape(prog.constants[i]) if i in prog.constants else None for i in n.inputs))
            for n in prog.nodes]


@pytest.mark.parametrize("name", MODELS)
def test_light_model_shipped_and_random_weights(device, name):
    model = onnx.load(light_model_paths()[name])
    feeds = _feeds(model, [(1, 3, 224, 224)], seed=0)
    rand = randomize_weights(model, seed=1)
    shipped, rand_prog = build_program(model), build_program(rand)
    assert _device_nodes(shipped) == _device_nodes(rand_prog)
    if name in SHIPPED:
        # shipped weights: uniform-ish outputs, so no "non-constant" demand on the reference
        run_vs_ort(model, feeds, device, rtol=1e-3, atol=1e-5, check_nonconstant=False,
                   net=_net(model, device, shipped))
    run_vs_ort(rand, feeds, device, rtol=1e-3, atol=1e-5, net=_net(rand, device, rand_prog))


@pytest.mark.parametrize("name,shapes", [
    ("squeezenet", [(1, 3, 64, 64), (2, 3, 64, 64), (2, 3, 64, 64), (1, 3, 96, 80), (3, 3, 48, 48), (1, 3, 64, 64)]),
    ("densenet121", [(1, 3, 64, 64), (2, 3, 64, 64), (1, 3, 96, 96), (2, 3, 64, 64)]),
])
def test_light_model_over_batch_and_spatial_sequence(device, name, shapes):
    model = make_input_dynamic(randomize_weights(onnx.load(light_model_paths()[name]), seed=2))
    run_vs_ort(model, _feeds(model, shapes, seed=3), device, rtol=1e-3, atol=1e-5)
