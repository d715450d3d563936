"""tests/kernel_warmup.py's table: every kernel the package's kernel modules define is in it, each row names a
kernel with as many argument types as it takes, and the types read back as numba's."""
import importlib
import inspect

import pytest
from numba.core.registry import CPUDispatcher

from tests.kernel_warmup import KERNELS, argument_types, shares


def _kernels(module: str) -> set[str]:
    """The kernels a module defines that are called as themselves (helpers inlined into them are not)."""
    namespace = importlib.import_module(f"dpledger.mechanisms.{module}")
    return {name for name, value in vars(namespace).items()
            if isinstance(value, CPUDispatcher) and value.targetoptions.get("inline", "never") == "never"
            and value.__module__ == namespace.__name__}


@pytest.mark.parametrize("module", ["fused", "add_one"])
def test_every_kernel_is_warmed(module):
    listed = {name for listed_module, name, _ in KERNELS if listed_module == module}
    missing = _kernels(module) - listed
    assert not missing, f"add these kernels of dpledger.mechanisms.{module} to tests/kernel_warmup.py: {sorted(missing)}"


@pytest.mark.parametrize("module, name, codes", KERNELS)
def test_each_row_names_a_kernel_and_its_arity(module, name, codes):
    kernel = getattr(importlib.import_module(f"dpledger.mechanisms.{module}"), name)
    assert isinstance(kernel, CPUDispatcher)
    assert len(argument_types(codes)) == len(inspect.signature(kernel.py_func).parameters)


def test_argument_types_read_as_numba_types():
    from numba import types

    assert argument_types("f i b f2r b1") == (types.float64, types.int64, types.boolean,
                                              types.Array(types.float64, 2, "C", readonly=True),
                                              types.Array(types.boolean, 1, "C"))


@pytest.mark.parametrize("processes", [1, 2, 3])
def test_the_split_covers_each_row_once(processes):
    split = shares(processes)
    assert sorted(row for share in split for row in share) == list(range(len(KERNELS)))
