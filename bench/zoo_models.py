"""The zoo's models, shared by bench/zoo_accuracy.py and bench/zoo_speed.py:
torchvision 0.14's CNNs and PyTorch's own layers, 10 classes, dropout 0, each
with the input shape of one sample, wrapped so that forward(x, labels) returns
F.cross_entropy (tests/python/test_zoo.py trains small ones of the same kinds).
"""
import torch.nn as nn
import torch.nn.functional as F
import torchvision


class WithLoss(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, labels):
        return F.cross_entropy(self.model(x), labels)


class EncoderClassifier(nn.Module):
    """nn.TransformerEncoder (2 layers) over [batch, 8, 32], mean-pooled, then a linear head."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


class GruClassifier(nn.Module):
    """nn.GRU over [batch, 12, 16]; its last state through a linear head."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        _, state = self.gru(x)
        return self.head(state[-1])


def efficientnet_b0():
    from torchvision.models import efficientnet
    setting, last = efficientnet._efficientnet_conf("efficientnet_b0", width_mult=1.0, depth_mult=1.0)
    return efficientnet.EfficientNet(setting, 0.0, stochastic_depth_prob=0.0, num_classes=10, last_channel=last)


def vit():
    from torchvision.models import vision_transformer
    return vision_transformer.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                hidden_dim=32, mlp_dim=64, num_classes=10)


# name: (constructor, input shape per sample, has BatchNorm)
MODELS = {
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), (3, 32, 32), True),
    "mobilenet_v2": (lambda: torchvision.models.mobilenet_v2(num_classes=10, dropout=0.0), (3, 32, 32), True),
    "efficientnet_b0": (efficientnet_b0, (3, 32, 32), True),
    "shufflenet_v2_x0_5": (lambda: torchvision.models.shufflenet_v2_x0_5(num_classes=10), (3, 32, 32), True),
    "squeezenet1_1": (lambda: torchvision.models.squeezenet1_1(num_classes=10, dropout=0.0), (3, 64, 64), False),
    "transformer_encoder": (EncoderClassifier, (8, 32), False),
    "vit": (vit, (3, 32, 32), False),
    "gru": (GruClassifier, (12, 16), False),
}
