"""TensorFlow 1.x graphs of the project's torchvision CNNs, layer for layer, for the TensorFlow peer.

Each builder takes NHWC images and a ``variable`` factory ``(name, shape) -> tensor`` (so the caller
decides where variables live: on parameter-server tasks, or a local copy per worker) and returns the
logits. Shapes follow torchvision exactly (AlexNet's 64-192-384-256-256 features and 6x6 adaptive
pooling, VGG's configurations with 7x7 adaptive pooling, ResNet's v1.5 bottlenecks with the stride on
the 3x3 convolution and bias-free convolutions), so parameter counts equal the project's models
(:func:`parameter_count` against ``ralp_pipe.engine.models``). Batch normalisation normalises with
the batch's statistics and keeps no moving averages (they are not trained variables and move no bytes
between tasks). Dropout is left out: it moves no bytes and costs little next to the layers.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow.compat.v1 as tf

Variable = Callable[[str, list[int]], "tf.Tensor"]

VGG_LAYERS = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}
RESNET_BLOCKS = {"resnet18": ("basic", [2, 2, 2, 2]), "resnet50": ("bottleneck", [3, 4, 6, 3])}
MODELS = ("alexnet", *VGG_LAYERS, *RESNET_BLOCKS)


def _conv(
    x: tf.Tensor, var: Variable, name: str, out: int, kernel: int, stride: int, pad: int, bias: bool
) -> tf.Tensor:
    """A convolution padded as torch pads it (symmetric `pad` pixels), NHWC."""
    w = var(f"{name}/weights", [kernel, kernel, int(x.shape[-1]), out])
    if pad:
        x = tf.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    y = tf.nn.conv2d(x, w, strides=[1, stride, stride, 1], padding="VALID")
    return tf.nn.bias_add(y, var(f"{name}/biases", [out])) if bias else y


def _max_pool(x: tf.Tensor, kernel: int, stride: int, pad: int = 0) -> tf.Tensor:
    if pad:
        x = tf.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]], constant_values=float("-inf"))
    return tf.nn.max_pool2d(x, kernel, stride, "VALID")


def _adaptive_matrix(size_in: int, size_out: int) -> np.ndarray:
    """The (out, in) averaging matrix of torch's adaptive average pooling along one axis."""
    matrix = np.zeros((size_out, size_in), dtype=np.float32)
    for i in range(size_out):
        start, end = (i * size_in) // size_out, -((-(i + 1) * size_in) // size_out)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


def _adaptive_avg_pool(x: tf.Tensor, size: int) -> tf.Tensor:
    """torch.nn.AdaptiveAvgPool2d(size) on NHWC, exactly (a fixed averaging matrix along each axis)."""
    h, w = int(x.shape[1]), int(x.shape[2])
    if (h, w) == (size, size):
        return x
    rows, cols = tf.constant(_adaptive_matrix(h, size)), tf.constant(_adaptive_matrix(w, size))
    return tf.einsum("ih,nhwc,jw->nijc", rows, x, cols)


def _dense(x: tf.Tensor, var: Variable, name: str, out: int) -> tf.Tensor:
    w = var(f"{name}/weights", [int(x.shape[-1]), out])
    return tf.nn.bias_add(tf.matmul(x, w), var(f"{name}/biases", [out]))


def _flatten_chw(x: tf.Tensor) -> tf.Tensor:
    """Flatten NHWC in torch's (C, H, W) order, so the first dense layer has torch's shape and meaning."""
    x = tf.transpose(x, [0, 3, 1, 2])
    return tf.reshape(x, [-1, int(np.prod(x.shape[1:]))])


def _classifier(x: tf.Tensor, var: Variable, classes: int) -> tf.Tensor:
    x = tf.nn.relu(_dense(_flatten_chw(x), var, "fc6", 4096))
    x = tf.nn.relu(_dense(x, var, "fc7", 4096))
    return _dense(x, var, "fc8", classes)


def alexnet(x: tf.Tensor, var: Variable, classes: int) -> tf.Tensor:
    """torchvision's AlexNet."""
    for i, (out, kernel, stride, pad, pool) in enumerate(
        [(64, 11, 4, 2, True), (192, 5, 1, 2, True), (384, 3, 1, 1, False), (256, 3, 1, 1, False), (256, 3, 1, 1, True)]
    ):
        x = tf.nn.relu(_conv(x, var, f"conv{i + 1}", out, kernel, stride, pad, bias=True))
        if pool:
            x = _max_pool(x, 3, 2)
    return _classifier(_adaptive_avg_pool(x, 6), var, classes)


def vgg(layers: list[int | str]) -> Callable[[tf.Tensor, Variable, int], tf.Tensor]:
    """torchvision's VGG of configuration `layers` (no batch normalisation)."""

    def build(x: tf.Tensor, var: Variable, classes: int) -> tf.Tensor:
        conv = 0
        for layer in layers:
            if layer == "M":
                x = _max_pool(x, 2, 2)
            else:
                conv += 1
                x = tf.nn.relu(_conv(x, var, f"conv{conv}", int(layer), 3, 1, 1, bias=True))
        return _classifier(_adaptive_avg_pool(x, 7), var, classes)

    return build


def _batch_norm(x: tf.Tensor, var: Variable, name: str) -> tf.Tensor:
    channels = int(x.shape[-1])
    gamma, beta = var(f"{name}/gamma", [channels]), var(f"{name}/beta", [channels])
    mean, variance = tf.nn.moments(x, axes=[0, 1, 2])
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-5)


def resnet(kind: str, blocks: list[int]) -> Callable[[tf.Tensor, Variable, int], tf.Tensor]:
    """torchvision's ResNet with `blocks` basic or bottleneck blocks per stage."""
    expansion = 4 if kind == "bottleneck" else 1

    def block(x: tf.Tensor, var: Variable, name: str, width: int, stride: int) -> tf.Tensor:
        out = width * expansion
        shortcut = x
        if stride != 1 or int(x.shape[-1]) != out:
            shortcut = _batch_norm(_conv(x, var, f"{name}/down", out, 1, stride, 0, False), var, f"{name}/down_bn")
        if kind == "bottleneck":
            y = tf.nn.relu(_batch_norm(_conv(x, var, f"{name}/c1", width, 1, 1, 0, False), var, f"{name}/bn1"))
            y = tf.nn.relu(_batch_norm(_conv(y, var, f"{name}/c2", width, 3, stride, 1, False), var, f"{name}/bn2"))
            y = _batch_norm(_conv(y, var, f"{name}/c3", out, 1, 1, 0, False), var, f"{name}/bn3")
        else:
            y = tf.nn.relu(_batch_norm(_conv(x, var, f"{name}/c1", width, 3, stride, 1, False), var, f"{name}/bn1"))
            y = _batch_norm(_conv(y, var, f"{name}/c2", width, 3, 1, 1, False), var, f"{name}/bn2")
        return tf.nn.relu(y + shortcut)

    def build(x: tf.Tensor, var: Variable, classes: int) -> tf.Tensor:
        x = tf.nn.relu(_batch_norm(_conv(x, var, "conv1", 64, 7, 2, 3, False), var, "bn1"))
        x = _max_pool(x, 3, 2, 1)
        for stage, count in enumerate(blocks):
            for b in range(count):
                stride = 2 if stage > 0 and b == 0 else 1
                x = block(x, var, f"layer{stage + 1}/{b}", 64 * 2**stage, stride)
        x = tf.reduce_mean(x, axis=[1, 2])
        return _dense(x, var, "fc", classes)

    return build


def builder(model: str) -> Callable[[tf.Tensor, Variable, int], tf.Tensor]:
    """The graph builder of `model` (one of :data:`MODELS`)."""
    if model == "alexnet":
        return alexnet
    if model in VGG_LAYERS:
        return vgg(VGG_LAYERS[model])
    if model in RESNET_BLOCKS:
        return resnet(*RESNET_BLOCKS[model])
    raise ValueError(f"the TensorFlow peer has no {model!r}; choose one of {', '.join(MODELS)}")


def parameter_count(model: str, classes: int, image_size: int = 224) -> int:
    """Trainable parameters of `model`'s graph (built in a throwaway graph)."""
    shapes: list[list[int]] = []

    def var(name: str, shape: list[int]) -> tf.Tensor:
        shapes.append(shape)
        return tf.zeros(shape)

    with tf.Graph().as_default():
        builder(model)(tf.zeros([1, image_size, image_size, 3]), var, classes)
    return int(sum(np.prod(shape) for shape in shapes))
