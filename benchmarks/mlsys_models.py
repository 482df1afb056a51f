"""The five CNNs of Checkmate's evaluation (Jain et al., "Checkmate: Breaking the Memory Wall with
Optimal Tensor Rematerialization", MLSys 2020), written in plain ``torch.nn`` for the solver benchmark.

Checkmate solved the training graphs of VGG16, VGG19, FCN-8s, SegNet and a U-Net at the layer level
(one node per layer, forward and backward). These models keep each paper's layer structure (the
number and order of convolutions, poolings, fully connected and upsampling layers, the skip
connections) and give every layer a module of its own, so that ``benchmarks/make_graphs.py``
profiles them into graphs of one node per layer. Two things are scaled down so that profiling on
two CPU cores takes seconds: every channel width is the paper's divided by :data:`WIDTH_DIVISOR`,
and the images are :data:`IMAGE_SIZE` pixels square (the VGG classifiers' fully connected layers
read the 1x1 map that leaves, 4096 wide in the paper, :data:`FC_WIDTH` here).

No torchvision is installed here, and these are written from the papers' layer tables.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import nn

# Channel widths are the papers' divided by this (VGG's 64..512 become 8..64).
WIDTH_DIVISOR = 8
# Input images are this many pixels square (the papers used 224, or 500 for FCN's PASCAL images):
# five 2x2 poolings take 32 to 1.
IMAGE_SIZE = 32
# VGG's fully connected layers are 4096 wide; here 4096 / WIDTH_DIVISOR.
FC_WIDTH = 4096 // WIDTH_DIVISOR
CLASSES = 10  # classifier outputs (1000 ImageNet classes in VGG), segmentation classes (21 in FCN)
# VGG's five blocks: convolutions per block, VGG16 (configuration D) and VGG19 (configuration E).
VGG16_BLOCKS = (2, 2, 3, 3, 3)
VGG19_BLOCKS = (2, 2, 4, 4, 4)
VGG_WIDTHS = (64, 128, 256, 512, 512)


def _width(channels: int) -> int:
    return max(1, channels // WIDTH_DIVISOR)


class ConvReLU(nn.Sequential):
    """One VGG layer: a 3x3 convolution (padding 1) and its ReLU, one node of the layer graph."""

    def __init__(self, cin: int, cout: int, kernel: int = 3):
        super().__init__(nn.Conv2d(cin, cout, kernel, padding=kernel // 2), nn.ReLU())


class ConvBNReLU(nn.Sequential):
    """One SegNet layer: a 3x3 convolution, batch normalisation and ReLU (Badrinarayanan et al.).

    The normalisation uses the batch's statistics only (``track_running_stats=False``), as in
    training: the running averages, read only at inference, are buffers the step updates, and the
    profiler gives each update a node of its own (50 nodes of 8-512 bytes on SegNet at module:2)."""

    def __init__(self, cin: int, cout: int):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout, track_running_stats=False),
                         nn.ReLU())


def vgg_layers(blocks: tuple[int, ...]) -> list[tuple[str, nn.Module]]:
    """VGG's convolutional part, layer by layer with Keras's names (``block1_conv1`` ... ``block5_pool``):
    ``blocks[i]`` 3x3 convolutions of width ``VGG_WIDTHS[i]`` then a 2x2 max pooling, per block."""
    layers, cin = [], 3
    for block, (convs, width) in enumerate(zip(blocks, VGG_WIDTHS), start=1):
        for conv in range(1, convs + 1):
            layers.append((f"block{block}_conv{conv}", ConvReLU(cin, _width(width))))
            cin = _width(width)
        layers.append((f"block{block}_pool", nn.MaxPool2d(2)))
    return layers


class VGG(nn.Module):
    """VGG (Simonyan & Zisserman, "Very Deep Convolutional Networks for Large-Scale Image
    Recognition", ICLR 2015): the convolutional blocks of :func:`vgg_layers`, then three fully
    connected layers (ReLU and dropout 0.5 after the first two, as the paper trains them)."""

    def __init__(self, blocks: tuple[int, ...]):
        super().__init__()
        self.features = nn.Sequential(OrderedDict(vgg_layers(blocks)))
        cells = _width(VGG_WIDTHS[-1]) * (IMAGE_SIZE // 32) ** 2
        self.classifier = nn.Sequential(OrderedDict([
            ("flatten", nn.Flatten()),
            ("fc1", nn.Sequential(nn.Linear(cells, FC_WIDTH), nn.ReLU(), nn.Dropout(0.5))),
            ("fc2", nn.Sequential(nn.Linear(FC_WIDTH, FC_WIDTH), nn.ReLU(), nn.Dropout(0.5))),
            ("predictions", nn.Linear(FC_WIDTH, CLASSES)),
        ]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def vgg16() -> VGG:
    """VGG16, configuration D of Simonyan & Zisserman 2015: 13 convolutions (blocks of 2, 2, 3, 3, 3),
    5 max poolings, 3 fully connected layers; widths divided by :data:`WIDTH_DIVISOR`."""
    torch.manual_seed(0)
    return VGG(VGG16_BLOCKS)


def vgg19() -> VGG:
    """VGG19, configuration E of Simonyan & Zisserman 2015: 16 convolutions (blocks of 2, 2, 4, 4, 4),
    5 max poolings, 3 fully connected layers; widths divided by :data:`WIDTH_DIVISOR`."""
    torch.manual_seed(0)
    return VGG(VGG19_BLOCKS)


class FCN8s(nn.Module):
    """FCN-8s (Long, Shelhamer & Darrell, "Fully Convolutional Networks for Semantic Segmentation",
    CVPR 2015): VGG16's 13 convolutions and 5 poolings; fc6 (7x7) and fc7 (1x1) as convolutions with
    dropout; a 1x1 class scorer on fc7, on pool4 and on pool3; the fc7 scores upsampled 2x (a
    transposed convolution) and added to pool4's, that sum upsampled 2x and added to pool3's, and
    the result upsampled 8x to the image. Widths divided by :data:`WIDTH_DIVISOR`; padding keeps
    the maps aligned, so no crops."""

    def __init__(self):
        super().__init__()
        layers = vgg_layers(VGG16_BLOCKS)
        cut3 = [name for name, _ in layers].index("block3_pool") + 1
        cut4 = [name for name, _ in layers].index("block4_pool") + 1
        self.to_pool3 = nn.Sequential(OrderedDict(layers[:cut3]))
        self.to_pool4 = nn.Sequential(OrderedDict(layers[cut3:cut4]))
        self.to_pool5 = nn.Sequential(OrderedDict(layers[cut4:]))
        fc = _width(4096)
        self.fc6 = nn.Sequential(ConvReLU(_width(512), fc, kernel=7), nn.Dropout2d(0.5))
        self.fc7 = nn.Sequential(ConvReLU(fc, fc, kernel=1), nn.Dropout2d(0.5))
        self.score_fr = nn.Conv2d(fc, CLASSES, 1)
        self.score_pool4 = nn.Conv2d(_width(512), CLASSES, 1)
        self.score_pool3 = nn.Conv2d(_width(256), CLASSES, 1)
        self.upscore2 = nn.ConvTranspose2d(CLASSES, CLASSES, 4, stride=2, padding=1, bias=False)
        self.upscore_pool4 = nn.ConvTranspose2d(CLASSES, CLASSES, 4, stride=2, padding=1, bias=False)
        self.upscore8 = nn.ConvTranspose2d(CLASSES, CLASSES, 16, stride=8, padding=4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool3 = self.to_pool3(x)
        pool4 = self.to_pool4(pool3)
        scores = self.score_fr(self.fc7(self.fc6(self.to_pool5(pool4))))
        fuse4 = self.upscore2(scores) + self.score_pool4(pool4)
        fuse3 = self.upscore_pool4(fuse4) + self.score_pool3(pool3)
        return self.upscore8(fuse3)


class SegNet(nn.Module):
    """SegNet (Badrinarayanan, Kendall & Cipolla, "SegNet: A Deep Convolutional Encoder-Decoder
    Architecture for Image Segmentation", TPAMI 2017): an encoder of VGG16's 13 convolutions, each
    with batch normalisation and ReLU, whose 5 max poolings keep their indices; a mirrored decoder
    whose 5 unpoolings place values at those indices, each followed by the mirrored convolutions
    (13, with batch normalisation and ReLU, the last a convolution to the class scores).
    Widths divided by :data:`WIDTH_DIVISOR`."""

    def __init__(self):
        super().__init__()
        widths = [_width(w) for w in VGG_WIDTHS]
        self.encoder = nn.ModuleList()
        self.pools = nn.ModuleList()
        cin = 3
        for convs, width in zip(VGG16_BLOCKS, widths):
            self.encoder.append(nn.Sequential(*[ConvBNReLU(cin if i == 0 else width, width) for i in range(convs)]))
            self.pools.append(nn.MaxPool2d(2, return_indices=True))
            cin = width
        self.unpools = nn.ModuleList()
        self.decoder = nn.ModuleList()
        for block in reversed(range(len(widths))):
            width, convs = widths[block], VGG16_BLOCKS[block]
            out = widths[block - 1] if block > 0 else None
            layers: list[nn.Module] = [ConvBNReLU(width, width) for _ in range(convs - 1)]
            layers.append(ConvBNReLU(width, out) if out is not None else nn.Conv2d(width, CLASSES, 3, padding=1))
            self.unpools.append(nn.MaxUnpool2d(2))
            self.decoder.append(nn.Sequential(*layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        indices = []
        for block, pool in zip(self.encoder, self.pools):
            x, index = pool(block(x))
            indices.append(index)
        for unpool, block in zip(self.unpools, self.decoder):
            x = block(unpool(x, indices.pop()))
        return x


class VGGUNet(nn.Module):
    """A U-Net (Ronneberger, Fischer & Brox, MICCAI 2015) with VGG16's encoder, the kind Checkmate's
    evaluation solves (Jain et al., MLSys 2020): the encoder is VGG16's 13 convolutions in its 5
    blocks, pooled between blocks (4 poolings); each of the 4 decoder levels upsamples 2x with a
    transposed convolution, concatenates the encoder block's output at that scale and applies two
    3x3 convolutions with ReLU; a 1x1 convolution gives the class scores. Widths divided by
    :data:`WIDTH_DIVISOR`."""

    def __init__(self):
        super().__init__()
        widths = [_width(w) for w in VGG_WIDTHS]
        self.encoder = nn.ModuleList()
        cin = 3
        for convs, width in zip(VGG16_BLOCKS, widths):
            self.encoder.append(nn.Sequential(*[ConvReLU(cin if i == 0 else width, width) for i in range(convs)]))
            cin = width
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ModuleList()
        self.decoder = nn.ModuleList()
        for width in reversed(widths[:-1]):
            self.up.append(nn.ConvTranspose2d(cin, width, 2, stride=2))
            self.decoder.append(nn.Sequential(ConvReLU(2 * width, width), ConvReLU(width, width)))
            cin = width
        self.head = nn.Conv2d(cin, CLASSES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.encoder):
            if i > 0:
                x = self.pool(x)
            x = block(x)
            skips.append(x)
        skips.pop()  # the bottom block's output is what the decoder starts from
        for up, block in zip(self.up, self.decoder):
            x = block(torch.cat([up(x), skips.pop()], dim=1))
        return self.head(x)


def fcn8s() -> FCN8s:
    torch.manual_seed(0)
    return FCN8s()


def segnet() -> SegNet:
    torch.manual_seed(0)
    return SegNet()


def vgg_unet() -> VGGUNet:
    torch.manual_seed(0)
    return VGGUNet()


def images(batch: int) -> tuple[torch.Tensor]:
    """A batch of random ``IMAGE_SIZE``-square RGB images (the models' only input)."""
    return (torch.randn(batch, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(1)),)


def classification_loss(output: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against class 0 (the label's value does not change the graph's costs)."""
    return nn.functional.cross_entropy(output, torch.zeros(output.shape[0], dtype=torch.long))


def segmentation_loss(output: torch.Tensor) -> torch.Tensor:
    """Per-pixel cross-entropy against class 0."""
    target = torch.zeros(output.shape[0], output.shape[2], output.shape[3], dtype=torch.long)
    return nn.functional.cross_entropy(output, target)


# name -> (model builder, loss); make_graphs.py profiles each on images(batch).
MLSYS_MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[torch.Tensor], torch.Tensor]]] = {
    "vgg16": (vgg16, classification_loss),
    "vgg19": (vgg19, classification_loss),
    "fcn8": (fcn8s, segmentation_loss),
    "segnet": (segnet, segmentation_loss),
    "vgg-unet": (vgg_unet, segmentation_loss),
}
