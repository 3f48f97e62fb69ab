"""User models: `path/to/file.py:factory` or `package.module:factory` -> a LayeredModel.

The factory takes no arguments (or the `--set` keys as keyword arguments; a `device` parameter
gets "meta" for profiling and planning and the real device to run, so a 7B model need not fit in
host memory to be planned) and returns `(module, example_batch)`, where example_batch is the
inputs tensor, a dict of input tensors (models/user_inputs.py) or an `(inputs, targets)` pair,
with the batch in dim 0. A LayeredModel is used as is; a raw transformers model on token ids is
split into its layers (models/hf_layers.py). Otherwise the module's top-level children become the
layers when running them in order reproduces `module(inputs)` (always for an nn.Sequential, or any
module whose forward is such a chain); if not, layers are cut from its torch.fx graph wherever one
tensor is live (models/fx_layers.py: torchvision-style ResNet/ViT blocks, skips kept inside a
layer) and between the user's submodules, whatever crosses there (a U-Net's long skips: layers
then take and return tuples of the crossing tensors); failing that, the whole module is one
layer. Every failure is one MeshplanError line naming the file, factory or layer and the fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from meshplan.errors import MeshplanError
from meshplan.models.fx_layers import fx_layers, graph_edges
from meshplan.models.identity import num_params, retie, tied_groups
from meshplan.models.user_inputs import DictInputs, OutputTensor, pack
from meshplan.models.zoo.base import LayeredModel, Output


def load_user_model(spec: str, overrides: dict[str, Any] | None, device: str, seed: int = 0) -> LayeredModel:
    """Import the factory named by `spec`, call it and wrap its module (see module docstring)."""
    target, _, name = spec.rpartition(":")
    factory = _find_factory(_import_target(target, spec), name, target, spec)
    torch.manual_seed(seed)
    module, batch = _call_factory(factory, overrides, spec, device)
    if any(p.is_meta for p in module.parameters()) and device != "meta":
        raise MeshplanError(
            f"--model {spec}: the factory built the model on the meta device; give it a "
            "`device` keyword parameter (meshplan passes 'meta' to profile and plan, the real "
            "device to run) and build with `with torch.device(device): ...`"
        )
    model = module if isinstance(module, LayeredModel) else wrap_module(module, batch, spec)
    tied = tied_groups(model)  # .to() unties shared weights: tie them again
    return retie(model.to(device), tied)


def factory_device(spec: str) -> str:
    """Where the profiler builds `spec`: "meta" when its factory takes a `device` parameter."""
    target, _, name = spec.rpartition(":")
    factory = _find_factory(_import_target(target, spec), name, target, spec)
    return "meta" if _takes_device(factory) else "cpu"


def _takes_device(factory: Callable) -> bool:
    try:
        return "device" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def _import_target(target: str, spec: str):
    if target == "analytic":
        raise MeshplanError(
            f"--model {spec}: analytic models are closed-form profiles for plan and estimate, with no "
            "module to profile or run; use a zoo family with --set (e.g. --model gpt --set layers=2)"
        )
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if path.is_dir():
            raise MeshplanError(
                f"--model {spec}: {target!r} is a directory; give a path to a .py file followed by :factory"
            )
        if not path.is_file():
            raise MeshplanError(
                f"--model {spec}: file {target!r} not found; give a path to a .py file "
                "(relative to the current directory) followed by :factory"
            )
        digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
        module_name = f"meshplan_user_{path.stem}_{digest}"
        if module_name in sys.modules:
            return sys.modules[module_name]
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        assert loader_spec is not None and loader_spec.loader is not None  # a .py file has a source loader
        loader = loader_spec.loader
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        folder = str(path.resolve().parent)  # `import helpers` beside the file works, as in `python file.py`
        if folder not in sys.path:
            sys.path.insert(0, folder)
        _run_import(
            lambda: loader.exec_module(module),
            target,
            spec,
            on_fail=lambda: sys.modules.pop(module_name, None),
        )
        return module
    return _run_import(lambda: importlib.import_module(target), target, spec)


class _HardExit(Exception):
    """os._exit called by a user's model code (made an exception while meshplan runs that code)."""

    def __init__(self, code: int):
        super().__init__(f"os._exit({code})")
        self.code = code


@contextlib.contextmanager
def _no_hard_exit() -> Iterator[None]:
    """os._exit in the user's import or factory would end meshplan at once with that code (0: a
    'success' that wrote nothing); while their code runs it raises instead."""

    def refuse(status: int = 0) -> NoReturn:  # os._exit's signature
        raise _HardExit(status)

    saved, os._exit = os._exit, refuse
    try:
        yield
    finally:
        os._exit = saved


def _run_import(load: Callable, target: str, spec: str, on_fail: Callable = lambda: None):
    try:
        with _no_hard_exit():
            return load()
    except _HardExit as exc:
        on_fail()
        raise MeshplanError(
            f"--model {spec}: importing {target} called os._exit({exc.code}); a model file must not exit"
        ) from None
    except ModuleNotFoundError as exc:
        on_fail()
        if exc.name == target or target.startswith(f"{exc.name}."):
            raise MeshplanError(
                f"--model {spec}: module {target!r} not found; install it or add its "
                "directory to PYTHONPATH (or give path/to/file.py:factory)"
            ) from None
        raise MeshplanError(
            f"--model {spec}: importing {target} failed: no module named {exc.name!r}; "
            f"install {exc.name} or fix the import"
        ) from None
    except SystemExit as exc:  # its exit code would read as one of meshplan's (3 = infeasible)
        on_fail()
        raise MeshplanError(
            f"--model {spec}: importing {target} called sys.exit({exc.code!r}); a model file "
            'must not exit (guard script code with `if __name__ == "__main__":`)'
        ) from None
    except Exception as exc:  # the user's code: any error becomes one line
        on_fail()
        raise MeshplanError(f"--model {spec}: importing {target} failed: {_one_line(exc)}; fix the file") from None


def _find_factory(module, name: str, target: str, spec: str) -> Callable:
    factory = getattr(module, name, None) if name else None
    if not callable(factory):
        found = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise MeshplanError(
            f"--model {spec}: no factory function {name!r} in {target}; define "
            f"`def {name or 'build'}(): return module, example_batch` (functions there: "
            f"{', '.join(found) or 'none'})"
        )
    return factory


def _call_factory(factory: Callable, overrides: dict | None, spec: str, device: str = "cpu") -> tuple[nn.Module, Any]:
    kwargs = dict(overrides or {})
    if _takes_device(factory):
        kwargs["device"] = device
    try:
        with _no_hard_exit():
            result = factory(**kwargs)
    except _HardExit as exc:
        raise MeshplanError(f"--model {spec}: the factory called os._exit({exc.code}); it must return") from None
    except TypeError as exc:
        if overrides and "argument" in str(exc):
            raise MeshplanError(
                f"--set {', '.join(overrides)}: {spec} does not accept it ({_one_line(exc)}); "
                "add keyword parameters to the factory or drop --set"
            ) from None
        raise MeshplanError(f"--model {spec}: the factory raised {_one_line(exc)}; fix the factory") from None
    except (Exception, SystemExit) as exc:
        raise MeshplanError(f"--model {spec}: the factory raised {_one_line(exc)}; fix the factory") from None
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)):
        got = type(result).__name__ + (f" of {len(result)}" if isinstance(result, tuple) else "")
        raise MeshplanError(
            f"--model {spec}: the factory returned {got}; it must return (torch.nn.Module, example_batch)"
        )
    return result


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def wrap_module(module: nn.Module, batch: Any, spec: str) -> LayeredModel:
    """UserModel over the module's children if they form a chain, else over the whole module."""
    inputs, targets = _split_batch(batch, spec)
    special = _wrap_special(module, inputs, targets)
    if special is not None:
        return special
    assert isinstance(inputs, torch.Tensor)  # _wrap_special took dict inputs
    on_meta = any(p.is_meta for p in module.parameters())
    if not on_meta:
        _check_trainable(module, inputs, spec)
    children = list(module.children())
    if len(children) > 1 and (
        isinstance(module, nn.Sequential) or (not on_meta and _is_chain(module, children, inputs))
    ):
        return UserModel(children, inputs, targets, chained=True)  # an nn.Sequential is a chain by definition
    layers = None if _is_transformers_model(module) else fx_layers(module, inputs)
    if layers:  # cut from the torch.fx graph where one tensor is live (models/fx_layers.py)
        return _warn_unplaced(UserModel(layers, inputs, targets, chained=True), module, spec)
    if _is_transformers_model(module):
        module = OutputTensor(module)
    return UserModel([module], inputs, targets, chained=False)


def _warn_unplaced(model: LayeredModel, module: nn.Module, spec: str) -> LayeredModel:
    """Name the module's parameters no layer holds: branches its forward does not take on the
    example batch (a Python `if` on a config flag, an nn.ModuleDict entry never called). They are
    not profiled, trained or checkpointed; the warning says so (model.warnings, the profile's
    notes and stderr)."""
    placed = {id(p) for p in model.parameters()}
    missing = [(n, p) for n, p in module.named_parameters() if id(p) not in placed]
    if missing:
        count = sum(p.numel() for _, p in missing)
        owners = sorted({n.rpartition(".")[0] or n for n, _ in missing})
        text = (
            f"--model {spec}: {count:,} of {count + num_params(model):,} parameters are not used by its forward on the "
            f"example batch ({', '.join(owners[:6])}{', ...' if len(owners) > 6 else ''}): they are not profiled, "
            "trained or checkpointed; give an example batch that takes those branches, or drop the modules"
        )
        model.warnings.append(text)
        warnings.warn(text, UnusedParametersWarning, stacklevel=2)
    return model


class UnusedParametersWarning(UserWarning):
    """A user module's parameters that its traced forward does not use (see _warn_unplaced)."""


def _wrap_special(module: nn.Module, inputs: torch.Tensor | dict, targets: torch.Tensor | None) -> LayeredModel | None:
    """Dict inputs: one DictInputs layer (models/user_inputs.py). A raw transformers model on token
    ids: its own layers (models/hf_layers.py), trained on next-token targets."""
    if isinstance(inputs, dict):
        packed, layout = pack(inputs)
        return UserModel([DictInputs(module, layout)], packed, targets, chained=False)
    if _is_transformers_model(module) and not inputs.is_floating_point() and inputs.dim() == 2:
        from meshplan.models.hf import wrap_hf_model

        return wrap_hf_model(module, int(inputs.shape[1]), None if targets is None else (inputs, targets))
    return None


def _is_transformers_model(module: nn.Module) -> bool:
    return any(cls.__name__ == "PreTrainedModel" for cls in type(module).__mro__)


def _split_batch(batch: Any, spec: str) -> tuple[torch.Tensor | dict, torch.Tensor | None]:
    tensors = lambda d: isinstance(d, dict) and d and all(isinstance(t, torch.Tensor) for t in d.values())  # noqa: E731
    if isinstance(batch, torch.Tensor) or tensors(batch):
        return batch, None
    if (
        isinstance(batch, (tuple, list))
        and len(batch) == 2
        and isinstance(batch[1], torch.Tensor)
        and (isinstance(batch[0], torch.Tensor) or tensors(batch[0]))
    ):
        return batch[0], batch[1]
    raise MeshplanError(
        f"--model {spec}: example_batch is {type(batch).__name__}; return a tensor of inputs, "
        "a dict of input tensors, or an (inputs, targets) pair, batch in dim 0"
    )


@torch.no_grad()
def _check_trainable(module: nn.Module, inputs: torch.Tensor, spec: str) -> None:
    """A module with trainable parameters whose forward runs on its own example batch."""
    if not any(p.requires_grad for p in module.parameters()):
        raise MeshplanError(
            f"--model {spec}: {type(module).__name__} has no trainable parameters "
            f"({len(list(module.children()))} child modules); there is nothing to train or split"
        )
    try:
        module(inputs)
    except Exception as exc:
        raise MeshplanError(
            f"--model {spec}: {type(module).__name__} fails on its example_batch of shape "
            f"{list(inputs.shape)}: {_one_line(exc)}; each layer's output must fit the next "
            "layer's input"
        ) from None


@torch.no_grad()
def _is_chain(module: nn.Module, children: list[nn.Module], inputs: torch.Tensor) -> bool:
    try:
        expected = module(inputs)
        x = inputs
        for child in children:
            x = child(x)
        return isinstance(expected, torch.Tensor) and x.shape == expected.shape and torch.allclose(x, expected)
    except Exception:
        return False


class ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous: the gradient of a skip that enters
    a torch.cat is a strided slice, and gloo sends and receives only contiguous tensors."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class UserModel(LayeredModel):
    """A user's module as layers "layers.0".."layers.N-1" (no embed/head)."""

    family = "user"

    def __init__(self, layers: Sequence[nn.Module], inputs: torch.Tensor, targets: torch.Tensor | None, chained: bool):
        super().__init__(None, layers, None)
        self._inputs, self._targets = inputs.detach().cpu(), None if targets is None else targets.detach().cpu()
        self.chained = chained
        """True when the module's top-level children were split into layers."""
        edges = graph_edges(layers)  # read now: a GraphModule's deepcopy drops its fx_* attributes
        wide = any(len(getattr(layer, "fx_outputs", ())) > 1 for layer in layers)
        self._edges = edges if wide or any(dst != src + 1 for src, dst, _, _ in edges) else []

    def forward(self, *xs: torch.Tensor) -> Output:
        """The layers in order; a layer cut from the fx graph may take and return a tuple of the
        tensors crossing its cuts (models/fx_layers.py). A pipeline stage holding some of the
        layers receives the crossing tensors as positional arguments and returns its last
        layer's output, so every tensor crossing a stage boundary is sent."""
        if self._edges:  # a stage's inputs: torch.distributed.pipelining receives their gradients
            xs = tuple(ContiguousGrad.apply(t) if t.requires_grad else t for t in xs)
        x = xs[0] if len(xs) == 1 else xs
        for layer in self.layers.values():
            x = layer(*x) if isinstance(x, tuple) else layer(x)
        return x

    def graph_edges(self) -> list[tuple[int, int, str, int]]:
        """(producer, consumer, value, position) of the tensors crossing the cuts between layers
        cut from the fx graph (models.fx_layers.graph_edges); [] for a chain."""
        return list(self._edges)

    @property
    def seq_len(self) -> int:
        x = self._inputs
        return int(x.shape[1]) if x.dim() == 2 and not x.is_floating_point() else 1

    def example_batch(self, batch_size, generator=None, device="cpu"):
        """The factory's example batch, cut or tiled to `batch_size` samples."""

        def resize(t):
            reps = -(-batch_size // t.shape[0])
            return t.repeat(reps, *([1] * (t.dim() - 1)))[:batch_size].to(device)

        targets = None if self._targets is None else resize(self._targets)
        return resize(self._inputs), targets

    def loss(self, output: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        """Cross-entropy for integer targets, MSE for float targets, mean output without targets."""
        if target is None:
            return output.float().mean()
        if target.is_floating_point():
            return nn.functional.mse_loss(output, target)
        return super().loss(output, target)
