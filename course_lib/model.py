"""The seed's model, shared by every script of the workbook, and a small transformer.

``MyModel`` is defined for lesson 00; its one change from the seed is ``flatten(1)`` instead of ``squeeze()``.
``RowTransformer`` reads the same images as sequences of rows, for the lessons that split a model's layers.
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


# --- a small transformer, for the lessons beyond data parallelism -------------------------------------------------
#
# Tensor, sequence and pipeline parallelism split a model's layers, not its batch, so they need a model with layers
# worth splitting: attention and an MLP, as in every large language model. RowTransformer reads MNIST as a sequence:
# an image's 28 rows are 28 tokens of 28 pixels. The data, the exact evaluation over the 10,000 validation images
# and the checkpoints stay those of the rest of the course; only the model changes.


class Attention(nn.Module):
    """Multi-head self-attention over all the tokens (no mask: a classifier sees the whole image).

    The number of heads is read from the width of ``q``'s output, ``head_dim`` numbers per head: a ``q``, ``k`` and
    ``v`` split by columns over several processes (tensor parallelism) then hold whole heads, and the same code runs
    on each process's share."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape
        q, k, v = (proj(x).view(n, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v)  # (N, heads, T, head_dim)
        return self.out(y.transpose(1, 2).reshape(n, t, -1))


class MLP(nn.Module):
    """Widen, GELU, narrow: the two matrices tensor parallelism cuts by columns, then by rows."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x)))


class Block(nn.Module):
    """A pre-norm transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), MLP(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class RowTransformer(nn.Module):
    """MNIST as a sequence: each of an image's 28 rows is a token of 28 pixels; ``layers`` blocks; the tokens'
    mean goes to a linear head: 10 logits. Takes the course's image batches, ``(N, 1, 28, 28)``."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 256, layers: int = 2):
        super().__init__()
        self.embed = nn.Linear(28, dim)
        self.position = nn.Parameter(0.02 * torch.randn(28, dim))  # which row a token is
        self.blocks = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.reshape(len(x), 28, 28)) + self.position  # (N, 28 tokens, dim)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h).mean(dim=1))


@torch.no_grad()
def count_right(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, chunk: int = 1000) -> int:
    """How many of ``images`` ``model`` puts in the class ``labels`` says, ``chunk`` images at a time on the model's
    device: the count a lesson shows for a checkpoint loaded into a plain model, or for its one-process reference."""
    device = next(model.parameters()).device
    return sum((model(images[i:i + chunk].to(device)).argmax(1).cpu() == labels[i:i + chunk]).sum().item()
               for i in range(0, len(images), chunk))
