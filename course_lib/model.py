"""The seed's model, shared by every script of the workbook.

Defined for lesson 00; its one change from the seed is ``flatten(1)`` instead of ``squeeze()``.
"""
import torch
from torch import nn


class MyModel(nn.Module):
    """conv 1->5 (3x3) -> BatchNorm -> conv 5->10 over the whole 28x28 image: 10 logits.

    There is no non-linearity between the layers, so the model is linear in its input
    (BatchNorm is an affine map at evaluation time): about 92% top-1 is its ceiling on MNIST.
    """

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 5, kernel_size=3, stride=1, padding=1)
        self.norm = nn.BatchNorm2d(5)
        self.head = nn.Conv2d(5, 10, kernel_size=28, stride=1, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x))
        x = self.head(x)  # (N, 10, 1, 1)
        # The seed's x.squeeze() also drops the batch dimension when N == 1: (10,) instead of (1, 10).
        return x.flatten(1)
