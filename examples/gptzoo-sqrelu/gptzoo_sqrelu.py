"""A third-party gptzoo plugin: the squared ReLU activation, relu(x)**2.

Squared ReLU is one of the two changes that "Primer" (So et al., 2021, "Primer: Searching for
Efficient Transformers for Language Modeling") found to matter most. This distribution adds it to
the registry through the entry point group ``gptzoo`` (see pyproject.toml), so any recipe can say
``activation = "squared_relu"`` once it is installed::

    gptzoo build gpt2-tiny --set model.activation=squared_relu
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

import gptzoo

gptzoo_contract = 2  # the plugin contract this module is written for (gptzoo.CONTRACT_VERSION)


class SquaredReLU(nn.Module):
    """Squared ReLU: relu(x)**2 (So et al., 2021, Primer)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(x).square()


@gptzoo.hookimpl
def register_activations(register):
    register("squared_relu", SquaredReLU)
