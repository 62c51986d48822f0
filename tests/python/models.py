"""The small models the RemoteAdamW tests train."""
import torch
from torch import nn


class MLP(nn.Module):
    """Two Linear layers and a LayerNorm; fc1.bias and norm.bias frozen."""

    def __init__(self, seed=0, inputs=32, hidden=64, outputs=10):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(inputs, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, outputs)
        self.fc1.bias.requires_grad_(False)
        self.norm.bias.requires_grad_(False)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def two_groups(model, named=True):
    """Param groups with their own lr and weight_decay (fc1 and norm; fc2)."""
    first = [p for n in ("fc1", "norm") for p in params_of(model, n, named)]
    return [{"params": first, "lr": 1e-2, "weight_decay": 0.01},
            {"params": params_of(model, "fc2", named), "lr": 3e-3, "weight_decay": 0.1}]


def params_of(model, module_name, named):
    module = getattr(model, module_name)
    if named:
        return list(module.named_parameters(prefix=module_name))
    return list(module.parameters())
